"""``kmm kubelet`` throughput and prepare latency, with two drivers side by side.

Run: ``.venv/bin/python bench/bench_kubelet.py [--pods 20] [--rounds 3]``

A sandbox with no KWOK node; one emulator in this process for one node; on
it ``kmm driver`` (a fake device tree of ``--pods`` devices) and the
Kubernetes DRA test driver (``--num-devices`` the same), both as processes,
each with a DeviceClass and a ResourceClaimTemplate. Each round, in turn:

- ``--pods`` pods without claims, created at once, timed until all Running:
  the emulator's own floor (scheduler, API writes, the pod loop);
- the same number with one claim each from ``kmm driver``'s template: the
  controller-manager makes the claims, the scheduler allocates them, the
  emulator prepares them;
- the same with the test driver's template.

The pods are deleted (and their claims unprepared) between runs. Printed:
pods/s for each and their ratio to the floor; when the last pod was bound
to the node (as the emulator saw it: the control plane's share) and when
all ran; and the NodePrepareResources latency as the emulator sees it
(p50/p99 per driver, over every round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from kmm.cli import paths
from kmm.kube import client, errors, resources
from kmm.kubelet import emulator, nodes
from kmm.sandbox import building, cluster, components

NAMESPACE = "default"
NODE = "bench-kubelet"


def fake_tree(root: Path, module: str, count: int) -> None:
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        entry = root / "sys/class" / module / f"{module}{i}"
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (root / "dev" / f"{module}{i}").write_text("")


async def eventually(check: Callable[[], Awaitable[bool]], what: str, bound: float = 300) -> None:
    deadline = time.monotonic() + bound
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"never happened within {bound:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def driver_process(argv: list[str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)


async def class_and_template(api: client.Client, driver: str) -> str:
    await api.request(
        "POST",
        resources.DEVICE_CLASSES.path(),
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    name = f"t-{driver.split('.')[0]}"
    await api.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "one", "exactly": {"deviceClassName": driver}}]
                    }
                }
            },
        },
    )
    return name


async def published(api: client.Client, driver: str) -> bool:
    listing = await api.request(
        "GET",
        resources.RESOURCE_SLICES.path(),
        query={"fieldSelector": f"spec.nodeName={NODE},spec.driver={driver}"},
    )
    return bool(listing["items"])


def pod_body(name: str, template: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "example.com/app:1"}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [container]}
    if template is not None:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "dev"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def pods(api: client.Client, selector: str) -> list[dict[str, Any]]:
    listing = await api.request(
        "GET", resources.PODS.path(NAMESPACE), query={"labelSelector": selector}
    )
    found: list[dict[str, Any]] = listing["items"]
    return found


async def run_pods(
    api: client.Client, count: int, template: str | None, seen: dict[str, float]
) -> tuple[float, float]:
    """Seconds from creating ``count`` pods to the last one bound to the node
    (as the emulator saw it: ``seen``) and to all Running; then all deleted."""
    run = uuid.uuid4().hex[:6]
    selector = f"bench-run={run}"
    started = time.monotonic()
    for i in range(count):
        body = pod_body(f"b-{run}-{i}", template)
        body["metadata"]["labels"] = {"bench-run": run}
        await api.request("POST", resources.PODS.path(NAMESPACE), body=body)

    async def running() -> bool:
        found = await pods(api, selector)
        return len(found) == count and all(
            (p.get("status") or {}).get("phase") == "Running" for p in found
        )

    await eventually(running, f"{count} pods Running")
    elapsed = time.monotonic() - started
    bound = max(seen[f"b-{run}-{i}"] for i in range(count)) - started
    await api.request("DELETE", resources.PODS.path(NAMESPACE), query={"labelSelector": selector})

    async def gone() -> bool:
        return not await pods(api, selector)

    await eventually(gone, "the pods gone")
    return bound, elapsed


@contextlib.asynccontextmanager
async def stopping(processes: list[asyncio.subprocess.Process]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
                await process.wait()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def bench(count: int, rounds: int, scratch: Path) -> None:
    binaries = await building.ensure_built(paths.cache_dir(), (components.DRA_TEST_DRIVER,))
    record = await cluster.up(
        cluster.Options(directory=scratch / "sandbox", cache_dir=paths.cache_dir(), nodes=0)
    )
    root = scratch / "root"
    kubelet_dir = root / "var/lib/kubelet"
    kmm_driver, test_driver = "kbench.kmm.io", "tbench.test.k8s.io"
    fake_tree(root, "kbench", count)
    (kubelet_dir / "plugins" / test_driver).mkdir(parents=True, exist_ok=True)
    try:
        async with cluster.api_client(record.kubeconfig) as api:

            async def service_account() -> bool:
                try:
                    await api.request("GET", resources.SERVICE_ACCOUNTS.path(NAMESPACE, "default"))
                except errors.NotFound:
                    return False
                return True

            await eventually(service_account, "the default ServiceAccount")
            running = emulator.Emulator(
                api, emulator.Options(node=nodes.NodeSpec(name=NODE), root=root)
            )
            durations: dict[str, list[float]] = {kmm_driver: [], test_driver: []}
            observe = running.metrics.observe

            def recording(operation: str, driver: str, seconds: float, *, ok: bool) -> None:
                if operation == "NodePrepareResources" and ok:
                    durations[driver].append(seconds)
                observe(operation, driver, seconds, ok=ok)

            running.metrics.observe = recording  # type: ignore[method-assign]
            seen: dict[str, float] = {}
            apply = running.pods.apply

            def seeing(event: Any) -> None:
                pod = event["object"]
                if (pod.get("spec") or {}).get("nodeName"):
                    seen.setdefault(pod["metadata"]["name"], time.monotonic())
                apply(event)

            running.pods.apply = seeing  # type: ignore[method-assign]
            stop = asyncio.Event()
            task = asyncio.ensure_future(running.run(stop))
            drivers = [
                await driver_process(
                    [
                        sys.executable, "-c", "from kmm.cli import main; main()", "driver",
                        f"--node={NODE}", f"--driver-name={kmm_driver}", "--module=kbench",
                        "--device-class=kbench", f"--root={root}",
                        f"--kubeconfig={record.kubeconfig}",
                    ],
                    scratch / "kmm-driver.log",
                ),
                await driver_process(
                    [
                        str(binaries["dra-test-driver"]), f"--kubeconfig={record.kubeconfig}",
                        f"--drivername={test_driver}", "kubelet-plugin", f"--node-name={NODE}",
                        f"--num-devices={count}",
                        f"--plugin-registration-path={kubelet_dir / 'plugins_registry'}",
                        f"--datadir={kubelet_dir / 'plugins'}",
                        f"--cdi-dir={root / 'var/run/cdi'}",
                    ],
                    scratch / "test-driver.log",
                ),
            ]  # fmt: skip
            async with stopping(drivers):
                templates = {}
                for driver in (kmm_driver, test_driver):
                    templates[driver] = await class_and_template(api, driver)
                    await eventually(lambda d=driver: published(api, d), f"{driver} published")

                    async def registered(d: str = driver) -> bool:
                        return running.registry.usable(d)

                    await eventually(registered, f"{driver} registered")
                times: dict[str, list[tuple[float, float]]] = {
                    "floor": [],
                    kmm_driver: [],
                    test_driver: [],
                }
                await run_pods(api, count, None, seen)  # warm-up: caches, connections
                for _ in range(rounds):
                    times["floor"].append(await run_pods(api, count, None, seen))
                    for driver in (kmm_driver, test_driver):
                        times[driver].append(await run_pods(api, count, templates[driver], seen))
            stop.set()
            await task
    finally:
        cluster.down(record.directory)

    def medians(kind: str) -> tuple[float, float]:
        return (
            statistics.median(b for b, _ in times[kind]),
            statistics.median(e for _, e in times[kind]),
        )

    floor_bound, floor = medians("floor")
    print(f"{count} pods per run, {rounds} rounds, median of the rounds:")
    print(
        f"  {'':<22} {'pods/s':>7} {'vs floor':>9} {'all bound':>10} {'all Running':>12}"
        f"  {'prepare p50':>11} {'p99':>8}"
    )
    print(
        f"  {'no claims (floor)':<22} {count / floor:7.1f} {1.0:8.2f}x"
        f" {floor_bound:8.2f} s {floor:10.2f} s"
    )
    for label, driver in (("kmm driver", kmm_driver), ("k8s DRA test driver", test_driver)):
        bound, median = medians(driver)
        observed = durations[driver]
        print(
            f"  {label:<22} {count / median:7.1f} {floor / median:8.2f}x"
            f" {bound:8.2f} s {median:10.2f} s"
            f"  {percentile(observed, 0.5) * 1000:8.1f} ms {percentile(observed, 0.99) * 1000:5.1f} ms"
            f"  ({len(observed)} calls)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kb", dir="/tmp"))  # short: sockets live here
    try:
        asyncio.run(bench(arguments.pods, arguments.rounds, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
