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
  spawn the five processes at once with those command lines (etcd, the API
  server, controller-manager, scheduler, KWOK; each retries what it needs
  from the others), poll every health endpoint together, create the same
  Node objects as soon as the API server is ready, and poll until they are
  Ready and untainted and the default ServiceAccount exists. Polls are every
  50 ms (``up`` polls every 200-250 ms, one component after another). The
  floor mints no keys (it writes kmm's), so kmm's time includes minting and
  the floor's does not: that is part of what the ratio shows.
  Its memory is read at the same point, so the RSS ratio says whether
  ``up`` leaves the processes holding more (same binaries, same flags).

``--cold`` first builds every binary into an empty cache with an empty Go
build cache (module downloads stay cached: they are network, not build). It
has no baseline: its work is the Go toolchain's ``go build`` of the pinned
packages, which ``up`` runs as they are (a floor would repeat those steps).

Wall clock on a shared machine: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import re
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kmm.kube import client, errors, resources
from kmm.kube import kubeconfigs as kube_access
from kmm.sandbox import building, cluster, health, nodes, ports, processes, state

POLL = 0.05
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


async def floor_up(plan: Plan, directory: pathlib.Path) -> tuple[float, dict[str, int]]:
    """The floor's start: its time, and its processes' memory once it is done."""
    launched: list[processes.Process] = []
    try:
        started = time.monotonic()
        for path, data in plan.files.items():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, data)
            os.close(fd)
        for name, argv, url in plan.launches:
            launched.append(
                processes.launch(name, argv, log=directory / "logs" / f"{name}.log", health_url=url)
            )
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

        async with client.Client(admin, timeout=5.0, max_attempts=1) as api:

            async def cluster_ready() -> None:
                await healthy(next(p for p in launched if p.name == "kube-apiserver"))
                await nodes.create(api, plan.node_plan)
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

                await asyncio.gather(_until(ready), _until(account))

            await asyncio.wait_for(
                asyncio.gather(
                    cluster_ready(),
                    *(healthy(p) for p in launched if p.name != "kube-apiserver"),
                ),
                600,
            )
        elapsed = time.monotonic() - started
        return elapsed, {process.name: process.rss_bytes() for process in launched}
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
        times: dict[str, list[float]] = {"kmm": [], "floor": []}
        rss: dict[str, dict[str, int]] = {}
        for run in range(arguments.runs):
            directory = pathlib.Path(scratch) / f"run-{run}"
            elapsed, rss["kmm"], plan = asyncio.run(_kmm_up(cache, directory, arguments.nodes))
            times["kmm"].append(elapsed)
            elapsed, rss["floor"] = asyncio.run(
                floor_up(plan, directory.with_name(f"{directory.name}-floor"))
            )
            times["floor"].append(elapsed)
        print(f"seconds to {arguments.nodes} nodes Ready (runs: kmm first, then the floor, each)")
        for name, values in times.items():
            print(
                f"  {name:<6} median {statistics.median(values):6.2f}"
                f"  (runs: {', '.join(f'{t:.2f}' for t in values)})"
            )
        ratios = [k / f for k, f in zip(times["kmm"], times["floor"], strict=True)]
        print(
            f"  kmm / floor: median of the medians {statistics.median(times['kmm']) / statistics.median(times['floor']):.2f}"
            f" (per run: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        print(f"  RSS (last run)          {'kmm':>8} {'floor':>8} {'kmm/floor':>9}")
        for name in rss["kmm"]:
            mine, bare = rss["kmm"][name], rss["floor"].get(name, 0)
            ratio = f"{mine / bare:9.2f}" if bare else f"{'-':>9}"
            print(f"  RSS {name:<24} {mine / 2**20:6.0f} MiB {bare / 2**20:6.0f} MiB {ratio}")
        total, bare_total = sum(rss["kmm"].values()), sum(rss["floor"].values())
        print(
            f"  RSS control plane total      {total / 2**20:6.0f} MiB {bare_total / 2**20:6.0f} MiB"
            f" {total / bare_total:9.2f}"
        )


if __name__ == "__main__":
    main()
