"""From applying a DRA Module to claim-holding pods Running, stage by stage.

Run: ``.venv/bin/python bench/bench_dra.py [--nodes 1 4] [--rounds 2]``

For each node count: a fresh sandbox without KWOK nodes; N emulated nodes
(``kmm kubelet`` in this process, each with a fake kernel module of two
devices); the operator in this process. At t=0 the driver's RBAC, the
example DRA Module (``examples.dra_module``) selecting the N nodes and one
workload pod per node (a claim from a template of the Module's class) are
applied at once. The script then polls until every workload runs and prints,
for each stage, when the last node reached it (so the slow stage shows):
the DRA DaemonSet created, the driver pods Running (the emulator runs
``kmm driver`` as their process), the drivers registered with their node,
slices published, claims allocated by the scheduler, claims prepared on the
node, workloads Running. Wall-clock seconds on a shared machine: compare
stages with each other, not runs across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

from kmm.api import examples, installation, labels
from kmm.cli import applying, paths
from kmm.kube import client, errors, resources
from kmm.kubelet import emulator, fakedevices, nodes
from kmm.operator import wiring
from kmm.sandbox import cluster

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
NAMESPACE = "default"
SELECT = "bench-dra"
STAGES = (
    "DaemonSet created",
    "driver pods Running",
    "drivers registered",
    "slices published",
    "claims allocated",
    "claims prepared",
    "workloads Running",
)


@contextlib.asynccontextmanager
async def emulated_nodes(
    api: client.Client, scratch: pathlib.Path, count: int
) -> AsyncIterator[list[emulator.Emulator]]:
    running, tasks, stop = [], [], asyncio.Event()
    for i in range(count):
        root = scratch / f"n{i}"
        fakedevices.lay_out(root, examples.DRA_MODULE, 2)
        spec = nodes.NodeSpec(name=f"bench-dra-{i}", labels=((SELECT, "yes"),))
        one = emulator.Emulator(api, emulator.Options(node=spec, root=root, wipe_delay=2.0))
        running.append(one)
        tasks.append(asyncio.ensure_future(one.run(stop)))
    try:
        for one in running:
            while True:
                try:
                    await api.request("GET", resources.NODES.path(name=one.options.node.name))
                    break
                except errors.NotFound:
                    await asyncio.sleep(0.1)
        yield running
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def workload(name: str, node: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {SELECT: "workload"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "app",
                    "image": "example.com/app:1",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }


async def stage_times(api: client.Client, running: list[emulator.Emulator]) -> dict[str, float]:
    module = examples.dra_module("bench", NAMESPACE, selector={SELECT: "yes"})
    driver = module["spec"]["dra"]["driverName"]
    device_class = module["spec"]["dra"]["deviceClasses"][0]["name"]
    (template, _pod) = examples.dra_workload(NAMESPACE, device_class)
    names = [one.options.node.name for one in running]
    started = time.monotonic()
    await applying.apply_documents(
        api,
        [
            *installation.dra_driver_rbac(NAMESPACE),
            module,
            template,
            *(workload(f"w-{node}", node, template["metadata"]["name"]) for node in names),
        ],
    )
    reached: dict[str, float] = {}

    def mark(stage: str, done: bool) -> None:
        if done and stage not in reached:
            reached[stage] = time.monotonic() - started

    while len(reached) < len(STAGES):
        daemonsets = await api.request(
            "GET",
            resources.DAEMONSETS.path(NAMESPACE),
            query={"labelSelector": f"{labels.ROLE}=dra"},
        )
        mark("DaemonSet created", bool(daemonsets["items"]))
        drivers = await api.request(
            "GET", resources.PODS.path(NAMESPACE), query={"labelSelector": f"{labels.ROLE}=dra"}
        )
        running_on = {
            p["spec"].get("nodeName")
            for p in drivers["items"]
            if (p.get("status") or {}).get("phase") == "Running"
        }
        mark("driver pods Running", running_on >= set(names))
        mark("drivers registered", all(one.registry.usable(driver) for one in running))
        slices = await api.request(
            "GET",
            resources.RESOURCE_SLICES.path(),
            query={"fieldSelector": f"spec.driver={driver}"},
        )
        mark("slices published", {s["spec"]["nodeName"] for s in slices["items"]} >= set(names))
        claims = await api.request("GET", resources.RESOURCE_CLAIMS.path(NAMESPACE))
        allocated = [c for c in claims["items"] if (c.get("status") or {}).get("allocation")]
        mark("claims allocated", len(allocated) >= len(names))
        mark(
            "claims prepared",
            all(any(i.prepared for i in one.manager.claims.values()) for one in running),
        )
        pods = await api.request(
            "GET", resources.PODS.path(NAMESPACE), query={"labelSelector": f"{SELECT}=workload"}
        )
        mark(
            "workloads Running",
            len(pods["items"]) == len(names)
            and all((p.get("status") or {}).get("phase") == "Running" for p in pods["items"]),
        )
        await asyncio.sleep(0.05)
    return reached


async def one_run(count: int, scratch: pathlib.Path) -> dict[str, float]:
    record = await cluster.up(
        cluster.Options(directory=scratch / "sandbox", cache_dir=paths.cache_dir(), nodes=0)
    )
    try:
        async with cluster.api_client(record.kubeconfig) as api:
            documents = []
            for folder in ("crd", "admission"):
                for path in sorted((DEPLOY / folder).glob("*.yaml")):
                    documents.extend(applying.load_documents(path.read_text()))
            await applying.apply_documents(api, documents)
            await asyncio.sleep(2)  # the CRD established, the policy in force
            operator = wiring.Operator(api, workers=2, election=None)
            stop = asyncio.Event()
            task = asyncio.ensure_future(operator.run(stop))
            try:
                async with emulated_nodes(api, scratch, count) as running:
                    return await stage_times(api, running)
            finally:
                stop.set()
                await task
    finally:
        cluster.down(record.directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    # The emulator warns while a pod waits for its driver: expected here.
    logging.basicConfig(level=logging.ERROR)
    results: dict[int, list[dict[str, float]]] = {}
    for count in arguments.nodes:
        for _ in range(arguments.rounds):
            scratch = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))  # short: sockets
            try:
                results.setdefault(count, []).append(asyncio.run(one_run(count, scratch)))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    header = "".join(f"{f'{n} node(s)':>12}" for n in arguments.nodes)
    print(
        f"seconds from applying the Module until the last node reached each stage (median of {arguments.rounds}):"
    )
    print(f"  {'stage':<22}{header}")
    for stage in STAGES:
        cells = "".join(
            f"{statistics.median(r[stage] for r in results[n]):12.2f}" for n in arguments.nodes
        )
        print(f"  {stage:<22}{cells}")


if __name__ == "__main__":
    main()
