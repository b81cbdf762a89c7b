"""A 50-node ordered upgrade driven by ``kmm upgrade --batch 10``, beside the cluster's floor.

Run: ``.venv/bin/python bench/bench_upgrade.py [--nodes 50] [--batch 10]``

1. A sandbox with ``--nodes`` KWOK nodes; the CRD; the operator in process
   on a client of its own (its writes counted); a Module with a device
   plugin at v1 on every node (user labels set, waited for).
2. The Module goes to v2 and ``kmm upgrade --to v2 ... --batch N`` moves
   every node (a process, timed from start to exit): the operator's time.
3. The floor: the Module goes to v3 (the operator makes the v3 DaemonSets),
   the operator stops, and a bare script makes the same label changes the
   operator makes, batch by batch, straight to the API server, waiting for
   the same pod states between them (device-plugin pods gone, loader pods
   gone, loader pods of v3 Ready, device-plugin pods of v3 Ready): what the
   cluster itself (DaemonSet controller, scheduler, KWOK) takes.
Printed: both times, their ratio, and the operator's API writes per node moved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kmm.api import labels, modules
from kmm.cli import applying
from kmm.kube import client, objects, resources
from kmm.operator import wiring, writing
from kmm.sandbox import cluster

NAMESPACE = "bench"
NAME = "up"
KERNEL = "6.8.0-45-generic"
DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
KMM = pathlib.Path(sys.executable).with_name("kmm")
SELECT = "bench-upgrade"


def module_body(version: str) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "selector": {SELECT: "yes"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "bench"},
                    "version": version,
                    "kernelMappings": [
                        {"literal": KERNEL, "containerImage": f"example.com/bench:{version}"}
                    ],
                }
            },
            "devicePlugin": {"container": {"image": f"example.com/plugin:{version}"}},
        },
    }


KEYS = {
    "user": labels.module_version(NAMESPACE, NAME),
    "loader": labels.module_loader_version(NAMESPACE, NAME),
    "plugin": labels.device_plugin_version(NAMESPACE, NAME),
    "ready": labels.ready(NAMESPACE, NAME),
    "done": labels.version_ready(NAMESPACE, NAME),
}


async def until(check: Callable[[], Awaitable[bool]], what: str, bound: float = 900) -> None:
    deadline = time.monotonic() + bound
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"never happened: {what}")
        await asyncio.sleep(0.2)


async def patch_labels(api: client.Client, node: str, change: dict[str, str | None]) -> None:
    await api.request(
        "PATCH",
        resources.NODES.path(name=node),
        body={"metadata": {"labels": change}},
        content_type=client.MERGE_PATCH,
    )


async def node_labels(api: client.Client) -> dict[str, dict[str, str]]:
    listing = await api.request("GET", resources.NODES.path(), query={"labelSelector": SELECT})
    return {objects.name(n): dict(objects.labels(n)) for n in listing["items"]}


async def pods(api: client.Client) -> list[dict[str, Any]]:
    listing = await api.request("GET", resources.PODS.path(NAMESPACE))
    found: list[dict[str, Any]] = listing["items"]
    return found


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return not deleting and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def all_on(api: client.Client, version: str) -> bool:
    return all(found.get(KEYS["done"]) == version for found in (await node_labels(api)).values())


async def pods_on(
    api: client.Client, nodes: list[str], role: str, version: str, *, ready: bool
) -> bool:
    """Whether every node has (``ready``) or has no (not ``ready``) such pod."""
    found = {
        (p.get("spec") or {}).get("nodeName")
        for p in await pods(api)
        if objects.labels(p).get(labels.ROLE) == role
        and objects.labels(p).get(labels.MODULE_VERSION) == version
        and (_ready(p) if ready else True)
    }
    return all((node in found) == ready for node in nodes)


async def floor(api: client.Client, nodes: list[str], batch: int, old: str, new: str) -> float:
    """The operator's label changes, made directly, waiting for the same pod states."""

    async def each(group: list[str], change: dict[str, str | None]) -> None:
        await asyncio.gather(*(patch_labels(api, n, change) for n in group))

    started = time.perf_counter()
    for start in range(0, len(nodes), batch):
        group = nodes[start : start + batch]
        await each(group, {KEYS["user"]: new, KEYS["plugin"]: None, KEYS["done"]: None})
        await until(lambda g=group: pods_on(api, g, "device-plugin", old, ready=False), "dp gone")
        await each(group, {KEYS["loader"]: None})
        await until(lambda g=group: pods_on(api, g, "module-loader", old, ready=False), "ld gone")
        await each(group, {KEYS["ready"]: None})
        await each(group, {KEYS["loader"]: new, KEYS["plugin"]: new})
        await until(lambda g=group: pods_on(api, g, "module-loader", new, ready=True), "ld up")
        await each(group, {KEYS["ready"]: ""})
        await until(lambda g=group: pods_on(api, g, "device-plugin", new, ready=True), "dp up")
        await each(group, {KEYS["done"]: new})
    return time.perf_counter() - started


async def set_module(api: client.Client, version: str) -> None:
    await api.request(
        "PATCH",
        writing.MODULES.path(NAMESPACE, NAME),
        body={"spec": module_body(version)["spec"]},
        content_type=client.MERGE_PATCH,
    )


async def main(args: argparse.Namespace) -> None:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="kmm-bench-upgrade-"))
    cache = pathlib.Path(os.environ.get("KMM_CACHE_DIR", pathlib.Path.home() / ".cache" / "kmm"))
    record = await cluster.up(
        cluster.Options(
            directory=directory,
            cache_dir=cache,
            nodes=args.nodes,
            kernels=(KERNEL,),
            start_timeout=600,
        )
    )
    nodes = record.node_names
    try:
        async with (
            cluster.api_client(record.kubeconfig) as api,
            cluster.api_client(record.kubeconfig) as own,
        ):
            docs = applying.load_documents(
                (DEPLOY / "crd" / "modules.kmm.sigs.x-k8s.io.yaml").read_text()
            )
            docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            await applying.apply_documents(api, docs)
            await asyncio.sleep(3)  # the CRD serves; the namespace's ServiceAccount
            for node in nodes:
                await patch_labels(api, node, {SELECT: "yes", KEYS["user"]: "v1"})
            operator = wiring.Operator(own, workers=4)
            stop = asyncio.Event()
            task = asyncio.ensure_future(operator.run(stop))
            await applying.apply_documents(api, [module_body("v1")])
            await until(lambda: all_on(api, "v1"), "v1 everywhere")
            await set_module(api, "v2")
            await asyncio.sleep(2)
            before = own.counter.total_writes
            started = time.perf_counter()
            done = await asyncio.to_thread(
                subprocess.run,
                [str(KMM), "upgrade", f"--kubeconfig={record.kubeconfig}", f"{NAMESPACE}/{NAME}",
                 *nodes, "--to", "v2", "--batch", str(args.batch), "--timeout", "600"],
                capture_output=True, text=True,
            )  # fmt: skip
            took = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"kmm upgrade failed: {done.stderr}")
            writes = own.counter.total_writes - before
            await set_module(api, "v3")
            await asyncio.sleep(5)  # the operator makes the v3 DaemonSets
            stop.set()
            await task
            floor_took = await floor(api, nodes, args.batch, "v2", "v3")
        print(f"{len(nodes)} nodes, batches of {args.batch}")
        print(
            f"kmm upgrade (operator):  {took:.1f} s, {writes} API writes, {writes / len(nodes):.1f} per node"
        )
        print(f"floor (bare script):     {floor_took:.1f} s")
        print(f"ratio operator/floor:    {took / floor_took:.2f}")
    finally:
        cluster.down(directory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--batch", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
