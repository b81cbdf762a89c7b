"""From applying a DRA Module to claim-holding pods Running, stage by stage, against no operator.

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
node, workloads Running.

The baseline, run after each of kmm's runs in a sandbox of its own, is the
floor for the same outcome: the same emulated nodes, the same driver (the
emulator runs ``kmm driver`` for the DaemonSet's pods), the same workloads,
but no operator. What kmm's operator wrote for the Module (its DeviceClass,
its DRA DaemonSet, the labels that DaemonSet's node selector asks of the
nodes) is read back after kmm's run and applied at t=0 instead of the
Module, without owner references or status. So each ratio is what the
operator adds to that stage: its watch, its reconcile, the Module's
admission. Wall-clock seconds on a shared machine: read the ratios.
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


def module() -> dict[str, Any]:
    return examples.dra_module("bench", NAMESPACE, selector={SELECT: "yes"})


def documents(
    names: list[str], instead_of_module: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """What is applied at t=0: the driver's RBAC, the Module (or, for the floor,
    what the operator wrote for it), the claim template, one workload per node."""
    device_class = module()["spec"]["dra"]["deviceClasses"][0]["name"]
    (template, _pod) = examples.dra_workload(NAMESPACE, device_class)
    return [
        *installation.dra_driver_rbac(NAMESPACE),
        *([module()] if instead_of_module is None else instead_of_module),
        template,
        *(workload(f"w-{node}", node, template["metadata"]["name"]) for node in names),
    ]


async def stage_times(
    api: client.Client,
    running: list[emulator.Emulator],
    instead_of_module: list[dict[str, Any]] | None,
) -> dict[str, float]:
    driver = module()["spec"]["dra"]["driverName"]
    names = [one.options.node.name for one in running]
    started = time.monotonic()
    await applying.apply_documents(api, documents(names, instead_of_module))
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


# Server-kept metadata: what the floor must not send back.
KEPT_METADATA = ("name", "namespace", "labels", "annotations")


async def operator_writes(api: client.Client, names: list[str]) -> list[dict[str, Any]]:
    """What the operator wrote for the Module to reach the workloads: its
    DeviceClass, its DRA DaemonSet and the labels that DaemonSet's node
    selector asks of the nodes, as apply documents (no owner, no status)."""

    def bare(obj: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in obj["metadata"].items() if k in KEPT_METADATA}
        meta.get("annotations", {}).pop("deprecated.daemonset.template.generation", None)
        return {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": meta,
            "spec": obj["spec"],
        }

    spec = module()["spec"]["dra"]
    device_class = await api.request(
        "GET", resources.DEVICE_CLASSES.path(name=spec["deviceClasses"][0]["name"])
    )
    daemonsets = await api.request(
        "GET", resources.DAEMONSETS.path(NAMESPACE), query={"labelSelector": f"{labels.ROLE}=dra"}
    )
    (daemonset,) = daemonsets["items"]
    wanted = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    node_labels = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": wanted}}
        for name in names
    ]
    return [
        bare({**device_class, "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"}),
        *node_labels,
        bare({**daemonset, "apiVersion": "apps/v1", "kind": "DaemonSet"}),
    ]


async def one_run(
    count: int, scratch: pathlib.Path, instead_of_module: list[dict[str, Any]] | None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One sandbox: with the operator (``instead_of_module`` None), or the floor."""
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
            if instead_of_module is not None:
                async with emulated_nodes(api, scratch, count) as running:
                    return await stage_times(api, running, instead_of_module), []
            operator = wiring.Operator(api, workers=2, election=None)
            stop = asyncio.Event()
            task = asyncio.ensure_future(operator.run(stop))
            try:
                async with emulated_nodes(api, scratch, count) as running:
                    reached = await stage_times(api, running, None)
                    names = [one.options.node.name for one in running]
                    return reached, await operator_writes(api, names)
            finally:
                stop.set()
                await task
    finally:
        cluster.down(record.directory)


def run_in_scratch(
    count: int, instead_of_module: list[dict[str, Any]] | None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))  # short: sockets
    try:
        return asyncio.run(one_run(count, scratch, instead_of_module))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    # The emulator warns while a pod waits for its driver: expected here.
    logging.basicConfig(level=logging.ERROR)
    results: dict[str, dict[int, list[dict[str, float]]]] = {"kmm": {}, "floor": {}}
    for count in arguments.nodes:
        for _ in range(arguments.rounds):
            # kmm first: the floor replays what its operator wrote, in a sandbox of its own.
            reached, written = run_in_scratch(count, None)
            results["kmm"].setdefault(count, []).append(reached)
            reached, _ = run_in_scratch(count, written)
            results["floor"].setdefault(count, []).append(reached)

    def median(who: str, count: int, stage: str) -> float:
        return statistics.median(r[stage] for r in results[who][count])

    print(
        "seconds from applying the Module until the last node reached each stage"
        f" (median of {arguments.rounds}); floor: the operator's writes applied instead"
    )
    header = "".join(f"{f'kmm {n}n':>9}{f'floor {n}n':>9}{'ratio':>7}" for n in arguments.nodes)
    print(f"  {'stage':<22}{header}")
    for stage in STAGES:
        cells = "".join(
            f"{median('kmm', n, stage):9.2f}{median('floor', n, stage):9.2f}"
            f"{median('kmm', n, stage) / median('floor', n, stage):7.2f}"
            for n in arguments.nodes
        )
        print(f"  {stage:<22}{cells}")


if __name__ == "__main__":
    main()
