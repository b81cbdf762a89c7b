"""Sandbox figures: warm ``up`` to all nodes Ready against a bare start; memory; cold build.

    .venv/bin/python bench/bench_sandbox.py [--runs 3] [--nodes 3] [--cold]

Warm start, kmm against its floor, alternating run by run in this process:

- kmm: ``cluster.up`` from nothing to every component healthy, the fake
  nodes Ready and untainted, and the default ServiceAccount made, which is
  what ``up`` guarantees; then the control plane's resident memory, then
  ``down``.
- The floor: the least work for the same guarantee. The files ``up`` wrote
  (certificates, keys, kubeconfigs, KWOK's stages) are read back after
  kmm's run, and its command lines kept, with the directory and the ports
  swapped for the floor's own (all untimed). Timed: write those bytes,
  spawn the processes with those command lines from a bare loop, poll
  every health endpoint together, create the same Node objects as soon as
  the API server is ready, and poll until they are Ready and untainted and
  the default ServiceAccount exists. Polls are every 50 ms (``up`` polls
  every 200-250 ms, and waits for etcd before it starts the API server).
  Two orders, each run: "servers first" starts etcd and the API server,
  then controller-manager, scheduler and KWOK once the API server is
  ready; "all at once" starts all five together (each retries what it
  needs from the others, with its own back-off). The faster median is the
  floor. It mints no keys (it writes kmm's), so kmm's time includes minting
  and the floor's does not. Each floor run prints when each step was done.
  Memory is read once Ready in both, so the RSS ratio says whether ``up``
  leaves the processes holding more (same binaries, same flags).

``--cold`` first builds every binary into an empty cache with an empty Go
build cache (module downloads stay cached: they are network, not build). It
has no baseline: the least work for the same binaries is the same ``go
build`` of the pinned packages with the same flags, which is kmm's build
itself (kmm adds one ``go list -deps`` for the progress count and one ``go
mod download -json`` for the version stamps, seconds against tens of
minutes); a floor that repeats kmm's steps is not a floor.

Wall clock on a shared machine: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kmm.kube import client, errors, resources
from kmm.kube import kubeconfigs as kube_access
from kmm.sandbox import building, cluster, health, ports, processes, state
from kmm.sandbox.kwoknodes import nodes

POLL = 0.05
# What the other components need serving before they start well.
SERVERS = ("etcd", "kube-apiserver")
# The two floors: the clients started once the API server is ready, or with it.
FLOORS = {"servers first": False, "all at once": True}
HOST_PORT = re.compile(rf"{re.escape(ports.HOST)}:([0-9]+)")
SKIPPED = ("etcd", "logs", state.STATE_FILE)


async def _cold_build(cache: pathlib.Path) -> float:
    started = time.monotonic()
    await building.ensure_built(cache)
    return time.monotonic() - started


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the floor replays of one of kmm's starts, rewritten for its own directory."""

    files: dict[pathlib.Path, bytes]
    launches: list[tuple[str, list[str], str]]  # name, argv, health URL
    node_plan: list[tuple[str, str]]
    kubeconfig: pathlib.Path


def plan_from(
    record: state.SandboxState, directory: pathlib.Path, options: cluster.Options
) -> Plan:
    """kmm's files and command lines, with its directory and ports swapped for new ones."""
    texts = [text for p in record.launched for text in (*p.argv, p.health_url)]
    old_ports = sorted({port for text in texts for port in HOST_PORT.findall(text)})
    swaps = [(re.compile(re.escape(str(record.directory))), str(directory))] + [
        (re.compile(rf"(?<![0-9]){old}(?![0-9])"), str(new))
        for old, new in zip(old_ports, ports.free_ports(len(old_ports)), strict=True)
    ]

    def swap(text: str) -> str:
        for old, new in swaps:
            text = old.sub(new, text)
        return text

    files = {}
    for path in sorted(record.directory.rglob("*")):
        relative = path.relative_to(record.directory)
        if path.is_file() and relative.parts[0] not in SKIPPED:
            data = path.read_bytes()
            if relative.parts[0] != "pki":  # kubeconfigs and KWOK's stages: text
                data = swap(data.decode()).encode()
            files[directory / relative] = data
    launches = [(p.name, [swap(a) for a in p.argv], swap(p.health_url)) for p in record.launched]
    return Plan(
        files=files,
        launches=launches,
        node_plan=nodes.spread(options.nodes, options.kernels),
        kubeconfig=directory / record.kubeconfig.relative_to(record.directory),
    )


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` every ``POLL`` seconds until it says yes."""
    while True:
        if await check():
            return
        await asyncio.sleep(POLL)


async def floor_up(
    plan: Plan, directory: pathlib.Path, *, at_once: bool
) -> tuple[float, dict[str, int], dict[str, float]]:
    """The floor's start: its time, its processes' memory once it is done, and
    when each step was done (seconds from the start)."""
    launched: list[processes.Process] = []
    marks: dict[str, float] = {}
    started = time.monotonic()

    def mark(what: str) -> None:
        marks[what] = time.monotonic() - started

    def launch(names: Sequence[str]) -> None:
        for name, argv, url in plan.launches:
            if name in names:
                log = directory / "logs" / f"{name}.log"
                launched.append(processes.launch(name, argv, log=log, health_url=url))

    try:
        for path, data in plan.files.items():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, data)
            os.close(fd)
        clients = [name for name, _, _ in plan.launches if name not in SERVERS]
        launch([*SERVERS, *(clients if at_once else ())])
        admin = kube_access.load(plan.kubeconfig)

        async def healthy(process: processes.Process) -> None:
            if process.name == "kube-apiserver":
                access = admin
            elif process.health_url.startswith("https"):
                access = kube_access.Access(
                    server=health.server_of(process.health_url), source=process.name, insecure=True
                )
            else:
                access = kube_access.Access(
                    server=health.server_of(process.health_url), source=process.name
                )
            path = process.health_url.removeprefix(access.server)
            async with client.Client(access, timeout=5.0, max_attempts=1) as probe:

                async def answers() -> bool:
                    if not process.alive():
                        raise SystemExit(f"the floor's {process.name} exited: see {process.log}")
                    try:
                        await probe.request("GET", path)
                    except errors.ApiError:
                        return False
                    return True

                await _until(answers)
            mark(f"{process.name} healthy")

        async with client.Client(admin, timeout=5.0, max_attempts=1) as api:
            wanted = {name for name, _ in plan.node_plan}

            async def ready() -> bool:
                listing = await api.request(
                    "GET", resources.NODES.path(), query={"labelSelector": "type=kwok"}
                )
                return wanted <= {
                    n["metadata"]["name"] for n in listing["items"] if _schedulable(n)
                }

            async def account() -> bool:
                try:
                    await api.request(
                        "GET", resources.SERVICE_ACCOUNTS.path("default", name="default")
                    )
                except errors.NotFound:
                    return False
                return True

            async def nodes_ready() -> None:
                await nodes.create(api, plan.node_plan)
                await _until(ready)
                mark("nodes Ready")

            async def account_made() -> None:
                await _until(account)
                mark("default ServiceAccount")

            async def after_apiserver() -> None:
                await healthy(next(p for p in launched if p.name == "kube-apiserver"))
                if not at_once:
                    launch(clients)
                await asyncio.gather(
                    nodes_ready(),
                    account_made(),
                    *(healthy(p) for p in launched if p.name not in SERVERS),
                )

            await asyncio.wait_for(asyncio.gather(after_apiserver(), healthy(launched[0])), 600)
        elapsed = time.monotonic() - started
        return elapsed, {process.name: process.rss_bytes() for process in launched}, marks
    finally:
        for process in reversed(launched):
            process.stop()


def _schedulable(node: Mapping[str, Any]) -> bool:
    """Ready and without a ``node.kubernetes.io/`` taint: what ``up`` waits for."""
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return ready and not any(
        str(t.get("key", "")).startswith("node.kubernetes.io/") for t in spec.get("taints") or ()
    )


async def _kmm_up(
    cache: pathlib.Path, directory: pathlib.Path, count: int
) -> tuple[float, dict[str, int], Plan]:
    started = time.monotonic()
    options = cluster.Options(directory=directory, cache_dir=cache, nodes=count)
    record = await cluster.up(options)
    elapsed = time.monotonic() - started
    try:
        rss = {process.name: process.rss_bytes() for process in record.launched}
        plan = plan_from(record, directory.with_name(f"{directory.name}-floor"), options)
    finally:
        cluster.down(directory)
    return elapsed, rss, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cold", action="store_true")
    arguments = parser.parse_args()

    cache = pathlib.Path(os.environ.get("KMM_CACHE_DIR", pathlib.Path.home() / ".cache" / "kmm"))
    with tempfile.TemporaryDirectory(prefix="kmm-bench-") as scratch:
        if arguments.cold:
            cache = pathlib.Path(scratch) / "cache"
            os.environ["GOCACHE"] = str(pathlib.Path(scratch) / "gocache")
            seconds = asyncio.run(_cold_build(cache))
            print(f"cold build of all binaries: {seconds / 60:.1f} min (no baseline: see --help)")
        times: dict[str, list[float]] = {}
        rss: dict[str, dict[str, int]] = {}
        for run in range(arguments.runs):
            directory = pathlib.Path(scratch) / f"run-{run}"
            elapsed, rss["kmm"], plan = asyncio.run(_kmm_up(cache, directory, arguments.nodes))
            times.setdefault("kmm", []).append(elapsed)
            floor_dir = directory.with_name(f"{directory.name}-floor")  # the plan's
            for label, at_once in FLOORS.items():
                shutil.rmtree(floor_dir, ignore_errors=True)  # a fresh etcd each time
                elapsed, rss[label], marks = asyncio.run(floor_up(plan, floor_dir, at_once=at_once))
                times.setdefault(label, []).append(elapsed)
                steps = ", ".join(f"{what} {when:.2f}" for what, when in marks.items())
                print(f"run {run}, floor {label}: {steps}")
        report(arguments.nodes, times, rss)


def report(count: int, times: dict[str, list[float]], rss: dict[str, dict[str, int]]) -> None:
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor = min(FLOORS, key=lambda name: medians[name])
    print(f"seconds to {count} nodes Ready, per run kmm first, then each floor")
    for name, values in times.items():
        runs = ", ".join(f"{t:.2f}" for t in values)
        print(f"  {name:<14} median {medians[name]:6.2f}  (runs: {runs})")
    for name in FLOORS:
        per_run = ", ".join(f"{k / f:.2f}" for k, f in zip(times["kmm"], times[name], strict=True))
        print(
            f"  kmm / floor {name}: {medians['kmm'] / medians[name]:.2f} (medians;"
            f" per run: {per_run}){'  <- the floor (the faster)' if name == floor else ''}"
        )
    print(f"  RSS once Ready (last run)    {'kmm':>8} {'floor':>10} {'kmm/floor':>9}")
    for name in rss["kmm"]:
        mine, bare = rss["kmm"][name], rss[floor].get(name, 0)
        ratio = f"{mine / bare:9.2f}" if bare else f"{'-':>9}"
        print(f"  RSS {name:<24} {mine / 2**20:6.0f} MiB {bare / 2**20:6.0f} MiB {ratio}")
    total, bare_total = sum(rss["kmm"].values()), sum(rss[floor].values())
    print(
        f"  RSS control plane total      {total / 2**20:6.0f} MiB {bare_total / 2**20:6.0f} MiB"
        f" {total / bare_total:9.2f}"
    )


if __name__ == "__main__":
    main()
