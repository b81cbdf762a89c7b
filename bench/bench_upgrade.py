"""A 50-node ordered upgrade v1 -> v2 by the operator and ``kmm upgrade --batch 10``, beside its floor.

Run: ``.venv/bin/python bench/bench_upgrade.py [--nodes 50] [--batch 10]``

One sandbox with ``--nodes`` KWOK nodes; one Module ``bench/up`` with a
device plugin, ordered upgrades on (seed 003). Both runs start from the same
state, made fresh each time by the operator and waited for: the Module at
v1, every node labelled for v1 and at ``.version.ready=v1``, the operator
idle. Both make the same transition, v1 -> v2 on every node in batches of
``--batch``:

Both are timed alike, by a watch on the nodes in this process: from the
first node showing the admin's user label v2 to every node showing
``.version.ready=v2``; in both, the v2 DaemonSets exist before that.

1. The operator's run (the operator in process on a client of its own,
   whose counter says what it wrote): the admin's change, the Module's
   image and version set to v2; once the operator has made the v2
   DaemonSets, ``kmm upgrade --to v2 --batch N`` as a process (its
   interpreter starts before the first label it writes, outside the time),
   which relabels each batch and follows it until every node is on v2.
2. The floor, with no operator: the operator's run is undone (Module,
   DaemonSets, pods and labels gone, waited for) and the v1 state made
   again, then the operator is stopped, and a bare script writes what the
   same guarantee needs, straight to the API server: the two v2 DaemonSets
   (as the operator wrote them in its run), then per batch, each write to
   all the batch's nodes at once (merge patches), waiting on a watch for the
   same pod states the operator waits for:

   - user label v2, device-plugin version label and ``.version.ready`` off;
     wait until no device-plugin pod of the Module is left on the nodes
     (terminating ones count, as they do for the operator);
   - loader and device-plugin version labels v2, ``.ready`` and
     ``.device-plugin-ready`` off (the operator removes the old loader label
     and ``.ready`` and then adds the new one without waiting for the old
     loader pod to be gone, so the floor does not wait for it either); wait
     until the v2 loader pod is Ready on every node;
   - ``.ready`` on; wait until the v2 device-plugin pod is Ready;
   - ``.version.ready=v2`` and ``.device-plugin-ready`` on;

   and the v1 DaemonSets deleted once the last batch left them.

Both runs must end in the same state (each node's labels of the Module,
where its pods run and are Ready, the DaemonSets); the script stops if
they do not. Printed: both times, the ratio, and each run's API writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import bench_operator

from kmm.api import labels, modules
from kmm.cli import applying
from kmm.kube import client, errors, listwatch, objects, reflecting, resources
from kmm.operator import wiring
from kmm.runtime import stores
from kmm.sandbox import cluster

NAMESPACE = "bench"
NAME = "up"
KERNEL = "6.8.0-45-generic"
DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
SELECT = "bench-upgrade"
KMM = pathlib.Path(sys.executable).with_name("kmm")
MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
BOUND = 900.0


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
    "plugin-ready": labels.device_plugin_ready(NAMESPACE, NAME),
    "done": labels.version_ready(NAMESPACE, NAME),
}


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Polls the API server (for setup and reset only; the timed runs watch)."""
    deadline = time.monotonic() + BOUND
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


async def all_on(api: client.Client, version: str) -> bool:
    return all(found.get(KEYS["done"]) == version for found in (await node_labels(api)).values())


async def empty(api: client.Client, resource: resources.Resource) -> bool:
    return not (await api.request("GET", resource.path(NAMESPACE)))["items"]


# -- the starting state, made by the operator -------------------------------


@contextlib.asynccontextmanager
async def operator(api: client.Client) -> AsyncIterator[wiring.Operator]:
    """The operator in process, on ``api`` (its own client), until the block ends."""
    found = wiring.Operator(api, workers=4)
    stop = asyncio.Event()
    task = asyncio.ensure_future(found.run(stop))
    try:
        yield found
    finally:
        stop.set()
        await task


async def idle(op: wiring.Operator) -> None:
    deadline = time.monotonic() + BOUND
    while not op.idle():
        if time.monotonic() > deadline:
            raise SystemExit("the operator never went idle")
        await asyncio.sleep(0.05)


async def at_v1(api: client.Client, nodes: Sequence[str], op: wiring.Operator) -> None:
    """Nodes labelled for v1, the Module at v1; until every node is on v1."""
    await asyncio.gather(
        *(patch_labels(api, n, {SELECT: "yes", KEYS["user"]: "v1"}) for n in nodes)
    )
    await applying.apply_documents(api, [module_body("v1")])
    await until(lambda: all_on(api, "v1"), "v1 everywhere")
    await idle(op)


async def undo(api: client.Client, nodes: Sequence[str]) -> None:
    """No Module, DaemonSet, pod or label of the Module left (the operator stopped)."""
    path = MODULES.path(NAMESPACE, NAME)
    await api.request(
        "PATCH", path, body={"metadata": {"finalizers": None}}, content_type=client.MERGE_PATCH
    )
    await api.request("DELETE", path)  # the garbage collector takes its DaemonSets and pods
    gone: dict[str, str | None] = dict.fromkeys(KEYS.values())
    await asyncio.gather(*(patch_labels(api, n, gone) for n in nodes))
    for resource in (resources.PODS, resources.DAEMONSETS, MODULES):
        await until(lambda r=resource: empty(api, r), f"no {resource.plural}")


# -- the operator's run ------------------------------------------------------


class Progress:
    """The selected nodes, kept by a watch: when the first took the user
    label ``version`` (the admin's first change) and when all carried
    ``.version.ready`` = ``version``. Both runs are timed by it, so the
    watch's lag is on both sides."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.nodes: dict[str, dict[str, str]] = {}
        self.first: float | None = None
        self.finished = asyncio.Event()
        self.last = 0.0
        self.synced = asyncio.Event()

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        self.nodes = {objects.name(n): dict(objects.labels(n)) for n in items}
        self._seen()
        self.synced.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] == "BOOKMARK":
            return
        name = objects.name(event["object"])
        if event["type"] == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = dict(objects.labels(event["object"]))
        self._seen()

    def _seen(self) -> None:
        now = time.perf_counter()
        if self.first is None and any(
            found.get(KEYS["user"]) == self.version for found in self.nodes.values()
        ):
            self.first = now
        if self.nodes and all(
            found.get(KEYS["done"]) == self.version for found in self.nodes.values()
        ):
            if not self.finished.is_set():
                self.last = now
            self.finished.set()

    def took(self) -> float:
        if self.first is None or not self.finished.is_set():
            raise SystemExit(f"the nodes never all reached {self.version}")
        return self.last - self.first


@contextlib.asynccontextmanager
async def watching(
    api: client.Client, resource: resources.Resource, sink: Any, **where: Any
) -> AsyncIterator[None]:
    """``sink`` kept by a reflector on ``resource`` until the block ends (synced first)."""
    source = listwatch.ApiListWatch(api, resource, namespace=where.pop("namespace", None))
    task = asyncio.ensure_future(reflecting.Reflector(resource.plural, source, sink, **where).run())
    try:
        await sink.synced.wait()
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def operator_run(
    api: client.Client, kubeconfig: pathlib.Path, nodes: list[str], batch: int
) -> float:
    """The admin's change: the Module to v2; once the operator has made the
    v2 DaemonSets, ``kmm upgrade`` (a process; its start is before the
    first label it writes, so outside the time)."""
    await api.request(
        "PATCH",
        MODULES.path(NAMESPACE, NAME),
        body={"spec": module_body("v2")["spec"]},
        content_type=client.MERGE_PATCH,
    )
    await until(lambda: _has(api, "v2"), "the v2 DaemonSets")
    progress = Progress("v2")
    async with watching(api, resources.NODES, progress, label_selector=SELECT):
        argv = [str(KMM), "upgrade", f"--kubeconfig={kubeconfig}", f"{NAMESPACE}/{NAME}", *nodes,
                "--to", "v2", "--batch", str(batch), "--timeout", "600"]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        printed, _ = await process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"kmm upgrade failed: {printed.decode()[-3000:]}")
        await asyncio.wait_for(progress.finished.wait(), BOUND)
    return progress.took()


async def _has(api: client.Client, version: str) -> bool:
    return len(await daemonsets_of(api, version)) == 2  # the loader (one kernel), the plugin


async def daemonsets_of(api: client.Client, version: str) -> list[dict[str, Any]]:
    """The Module's DaemonSets of ``version`` as the operator wrote them."""
    listing = await api.request("GET", resources.DAEMONSETS.path(NAMESPACE))
    found = []
    for ds in listing["items"]:
        if objects.labels(ds).get(labels.MODULE_VERSION) != version:
            continue
        found.append(bench_operator.as_written(ds, NAMESPACE))
    return found


# -- the floor ---------------------------------------------------------------


class Pods:
    """The namespace's pods, kept by a watch; ``changed`` set on every event."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Event()
        self.synced = asyncio.Event()

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        self.objects = {stores.key_of(p): p for p in items}
        self.synced.set()
        self.changed.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] == "BOOKMARK":
            return
        key = stores.key_of(event["object"])
        if event["type"] == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = event["object"]
        self.changed.set()

    def on(self, nodes: set[str], role: str, version: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.objects.values()
            if (p.get("spec") or {}).get("nodeName") in nodes
            and objects.labels(p).get(labels.ROLE) == role
            and (version is None or objects.labels(p).get(labels.MODULE_VERSION) == version)
        ]

    async def until(self, check: Callable[[], bool], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + BOUND
        while not check():
            self.changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self.changed.wait(), max(left, 0))
            except TimeoutError:
                raise SystemExit(f"never happened: {what}") from None


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return not deleting and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def all_ready(pods: Pods, group: set[str], role: str, version: str) -> bool:
    ready = {
        (p.get("spec") or {}).get("nodeName") for p in pods.on(group, role, version) if _ready(p)
    }
    return ready >= group


async def floor(
    api: client.Client,
    pods: Pods,
    nodes: list[str],
    batch: int,
    new: list[dict[str, Any]],
    old: list[str],
) -> int:
    """The writes and waits the guarantee needs, no operator; the writes."""
    module = await api.request("GET", MODULES.path(NAMESPACE, NAME))
    owner = {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "name": NAME,
        "uid": module["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    writes = 0

    async def each(group: set[str], change: dict[str, str | None]) -> None:
        nonlocal writes
        writes += len(group)
        await asyncio.gather(*(patch_labels(api, n, change) for n in group))

    await asyncio.gather(
        *(
            api.request(
                "POST",
                resources.DAEMONSETS.path(NAMESPACE),
                body={**ds, "metadata": {**ds["metadata"], "ownerReferences": [owner]}},
            )
            for ds in new
        )
    )
    writes += len(new)
    for start in range(0, len(nodes), batch):
        group = set(nodes[start : start + batch])
        await each(group, {KEYS["user"]: "v2", KEYS["plugin"]: None, KEYS["done"]: None})
        await pods.until(lambda g=group: not pods.on(g, "device-plugin"), "device plugins gone")
        await each(
            group,
            {
                KEYS["loader"]: "v2",
                KEYS["plugin"]: "v2",
                KEYS["ready"]: None,
                KEYS["plugin-ready"]: None,
            },
        )
        if start + batch >= len(nodes):  # no node runs v1 any more
            await asyncio.gather(
                *(api.request("DELETE", resources.DAEMONSETS.path(NAMESPACE, n)) for n in old)
            )
            writes += len(old)
        await pods.until(
            lambda g=group: all_ready(pods, g, "module-loader", "v2"), "v2 loaders Ready"
        )
        await each(group, {KEYS["ready"]: ""})
        await pods.until(
            lambda g=group: all_ready(pods, g, "device-plugin", "v2"), "v2 device plugins Ready"
        )
        await each(group, {KEYS["done"]: "v2", KEYS["plugin-ready"]: ""})
    return writes


# -- both ----------------------------------------------------------------------


async def install(api: client.Client) -> None:
    # Every CRD (Module, PreflightValidation): the operator watches both.
    docs = [
        doc
        for path in sorted((DEPLOY / "crd").glob("*.yaml"))
        for doc in applying.load_documents(path.read_text())
    ]
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    await applying.apply_documents(api, docs)
    await until(lambda: _serves(api), "the Module CRD served")
    await cluster.wait_default_account(api, NAMESPACE, timeout=120)


async def _serves(api: client.Client) -> bool:
    try:
        await api.request("GET", MODULES.path(NAMESPACE))
    except errors.NotFound:  # until the CRD is Established
        return False
    return True


async def end_state(api: client.Client) -> dict[str, Any]:
    """What a finished upgrade leaves, once no pod is terminating: each
    node's labels of the Module, where its pods run (role, version, Ready),
    its DaemonSets' names. Both runs must leave the same."""
    deadline = time.monotonic() + BOUND
    while True:
        pods = (await api.request("GET", resources.PODS.path(NAMESPACE)))["items"]
        daemonsets = (await api.request("GET", resources.DAEMONSETS.path(NAMESPACE)))["items"]
        going = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        old = [d for d in daemonsets if objects.labels(d).get(labels.MODULE_VERSION) == "v1"]
        if not going and not old:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"never settled: {len(going)} pods terminating, {len(old)} v1 DaemonSets"
            )
        await asyncio.sleep(0.2)
    keys = set(KEYS.values())
    return {
        "nodes": {
            name: {k: v for k, v in found.items() if k in keys}
            for name, found in (await node_labels(api)).items()
        },
        "pods": sorted(
            (
                str(p["spec"].get("nodeName")),
                objects.labels(p).get(labels.ROLE, ""),
                objects.labels(p).get(labels.MODULE_VERSION, ""),
                _ready(p),
            )
            for p in pods
        ),
        "daemonsets": sorted(objects.name(d) for d in daemonsets),
    }


@dataclasses.dataclass
class Measured:
    took: float
    writes: int  # the operator's
    floor_took: float
    floor_writes: int
    operator_end: dict[str, Any]
    floor_end: dict[str, Any]


async def measure(kubeconfig: pathlib.Path, nodes: list[str], batch: int) -> Measured:
    """Both runs on the sandbox of ``kubeconfig`` (the CRD installed)."""
    async with cluster.api_client(kubeconfig) as api:
        async with cluster.api_client(kubeconfig) as own, operator(own) as op:
            await at_v1(api, nodes, op)
            before = own.counter.total_writes
            took = await operator_run(api, kubeconfig, nodes, batch)
            writes = own.counter.total_writes - before
            new = await daemonsets_of(api, "v2")
            operator_end = await end_state(api)
        await undo(api, nodes)
        async with cluster.api_client(kubeconfig) as own, operator(own) as op:
            await at_v1(api, nodes, op)
        old = [objects.name(ds) for ds in await daemonsets_of(api, "v1")]
        pods, progress = Pods(), Progress("v2")
        async with (
            watching(api, resources.PODS, pods, namespace=NAMESPACE),
            watching(api, resources.NODES, progress, label_selector=SELECT),
        ):
            floor_writes = await floor(api, pods, nodes, batch, new, old)
            await asyncio.wait_for(progress.finished.wait(), BOUND)
        floor_took = progress.took()
        floor_end = await end_state(api)
    return Measured(took, writes, floor_took, floor_writes, operator_end, floor_end)


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
        async with cluster.api_client(record.kubeconfig) as api:
            await install(api)
        found = await measure(record.kubeconfig, nodes, args.batch)
        if found.operator_end != found.floor_end:
            raise SystemExit(
                f"the floor did not end where the operator did:\n{found.operator_end}\n"
                f"{found.floor_end}"
            )
        took, writes = found.took, found.writes
        print(f"{len(nodes)} nodes, v1 -> v2 in batches of {args.batch}; same start and end")
        print(
            f"operator + kmm upgrade: {took:.1f} s, {writes + len(nodes) + 1} API writes"
            f" (the operator's {writes}, {writes / len(nodes):.1f} per node; the admin's"
            f" Module patch and {len(nodes)} user labels)"
        )
        print(f"floor (bare script):    {found.floor_took:.1f} s, {found.floor_writes} API writes")
        print(f"ratio operator/floor:   {took / found.floor_took:.2f}")
    finally:
        cluster.down(directory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--batch", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
