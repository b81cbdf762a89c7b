"""The operator on 500 fake nodes and 5 kernels: convergence, API writes, memory.

Run: ``.venv/bin/python bench/bench_operator.py [--nodes 500] [--cached-nodes 5000]``

1. A dedicated sandbox (``kmm.sandbox.cluster.up``) with ``--nodes`` KWOK
   nodes over 5 kernels, in a temporary directory; the CRD from ``deploy/``.
2. The operator (the real wiring, in process, on a ``kube.client.Client``
   of its own, whose counter says what it wrote) converges one Module
   selecting every node: 5 loader DaemonSets,
   one pod per node (the real DaemonSet controller and scheduler; KWOK makes
   pods Ready), ``kernel-version.full`` and ``.ready`` labels on every node,
   status Ready. Printed: time from create to converged, the time the last
   loader pod turned Ready (the cluster's part), the operator's lag after it,
   and the operator's API writes by (verb, resource).
3. The floor: the same guarantee with no operator. The operator's Module
   is deleted, its DaemonSets, pods and node labels with it (waited for);
   then a bare script, through an independent client (kubernetes-asyncio,
   so the floor does not move with kmm's client), creates the same Module
   and writes what the operator wrote that the guarantee needs, the same
   objects (16 in flight): the finalizer, the 5 DaemonSets (as the operator
   made them, so they select the same nodes), each node's
   ``kernel-version.full``; it watches the namespace's pods and labels a
   node ``.ready`` once its loader pod is Ready, and writes the operator's
   final status once every node is. Timed like the operator's run, from the
   Module's create; the DaemonSet controller, scheduler and KWOK bringing
   the pods to Ready are in both. Both runs must end in the same state (node
   labels, pods Ready, DaemonSets, the Module's finalizer and status); the
   script stops if they do not. Printed: its time and writes, and the
   operator/floor ratios.
4. Memory: ``--cached-nodes`` minus ``--nodes`` bare Node objects (no KWOK
   annotation, realistic payloads: conditions, addresses, capacity, 20
   images) are created, then ``kmm operator`` runs as a process; its VmRSS is
   read once its caches have synced and it has reconciled the Module.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from kmm.api import labels, modules
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.operator import wiring
from kmm.sandbox import cluster

KERNELS = (
    "6.8.0-45-generic",
    "6.1.0-27-amd64",
    "5.14.0-427.el9.x86_64+",
    "6.11.0-1009-aws",
    "5.15.0-122-generic",
)
DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
PARALLEL = 16
NAMESPACE = "bench"
MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)


def module_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"type": "kwok"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmm_bench"},
                    "containerImage": "example.com/${MOD_NAME}:${KERNEL_FULL_VERSION}",
                    "kernelMappings": [
                        {"literal": "6.8.0-45-generic"},
                        {"regexp": r"^6\.1\.\d+-\d+-amd64$"},
                        {"regexp": r"\.el9\.x86_64$"},
                        {"regexp": r"-aws$", "containerImage": "example.com/aws:${KERNEL_XYZ}"},
                        {"regexp": r"^5\.15\."},
                    ],
                }
            },
        },
    }


async def _until(predicate: Any, interval: float = 0.05) -> None:
    while True:
        if predicate():
            return
        await asyncio.sleep(interval)


def _converged(op: wiring.Operator, key: str, nodes: int) -> bool:
    module = op.modules.store.get(key)
    conditions = ((module or {}).get("status") or {}).get("conditions") or ()
    if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
        return False
    namespace, name = key.split("/")
    ready = labels.ready(namespace, name)
    return sum(ready in (n["metadata"].get("labels") or {}) for n in op.nodes.store) == nodes


def _first_pass(op: wiring.Operator, nodes: int) -> bool:
    """The operator's own first round of writes is visible in its caches."""
    kernel_labelled = sum(
        labels.KERNEL_VERSION_FULL in (n["metadata"].get("labels") or {}) for n in op.nodes.store
    )
    return len(op.daemonsets.store) == len(KERNELS) and kernel_labelled >= nodes


def _pods_ready(op: wiring.Operator, nodes: int) -> bool:
    ready = 0
    for pod in op.pods.store:
        conditions = (pod.get("status") or {}).get("conditions") or ()
        ready += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready == nodes


async def independent_client(kubeconfig: pathlib.Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


async def converge(
    api: client.ApiClient, kubeconfig: pathlib.Path, nodes: int
) -> tuple[str, float, float, Counter[tuple[str, str]]]:
    """Converge one Module; the operator has a client of its own, so only its writes count."""
    async with cluster.api_client(kubeconfig) as own:
        return await _converge(api, own, nodes)


async def _converge(
    api: client.ApiClient, own: kube_client.Client, nodes: int
) -> tuple[str, float, float, Counter[tuple[str, str]]]:
    counter = own.counter
    op = wiring.Operator(own, workers=4)
    stop = asyncio.Event()
    task = asyncio.ensure_future(op.run(stop))
    try:
        await _until(op.manager.ready)
        name = f"bench-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, NAMESPACE, modules.PLURAL, module_body(name)
        )
        pods_ready_at = first_pass_at = None
        first_pass_writes = 0
        while not _converged(op, f"{NAMESPACE}/{name}", nodes):
            if first_pass_at is None and _first_pass(op, nodes):
                first_pass_at = time.perf_counter() - started
                first_pass_writes = counter.total_writes
            if pods_ready_at is None and _pods_ready(op, nodes):
                pods_ready_at = time.perf_counter() - started
            await asyncio.sleep(0.05)
        total = time.perf_counter() - started
        await _until(op.idle)
        counts = Counter(counter.writes)
        print(
            f"  first pass (finalizer, 5 DaemonSets, {nodes} kernel labels, events, status):"
            f" {first_pass_writes} writes done at {first_pass_at or total:.2f} s"
        )
        return name, total, pods_ready_at or total, counts
    finally:
        stop.set()
        await task


@dataclasses.dataclass
class Converged:
    """What the operator made: the Module's name, its DaemonSets and status."""

    name: str
    daemonsets: list[dict[str, Any]]
    status: dict[str, Any]
    kernels: dict[str, str]  # node -> its kernel-version.full label


def as_written(found: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A DaemonSet the operator made, as a bare script creates it again: its
    name, labels, annotations and spec (no owner, status or server fields)."""
    metadata = found["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": metadata["name"],
            "namespace": namespace,
            "labels": metadata.get("labels") or {},
            "annotations": metadata.get("annotations") or {},
        },
        "spec": found["spec"],
    }


async def capture(api: kube_client.Client, name: str) -> Converged:
    listing = await api.request("GET", resources.DAEMONSETS.path(NAMESPACE))
    daemonsets = [as_written(found, NAMESPACE) for found in listing["items"]]
    module = await api.request("GET", MODULES.path(NAMESPACE, name))
    listed = await api.request("GET", resources.NODES.path())
    kernels = {
        n["metadata"]["name"]: n["metadata"]["labels"][labels.KERNEL_VERSION_FULL]
        for n in listed["items"]
        if labels.KERNEL_VERSION_FULL in (n["metadata"].get("labels") or {})
    }
    return Converged(name, daemonsets, module["status"], kernels)


async def _all(calls: list[Callable[[], Awaitable[Any]]]) -> None:
    limit = asyncio.Semaphore(PARALLEL)

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        async with limit:
            await call()

    await asyncio.gather(*(one(call) for call in calls))


async def reset(api: kube_client.Client, made: Converged, nodes: list[str]) -> None:
    """Back to the state before the operator's run: no Module, no DaemonSet,
    no pod, no label of the operator's on any node (waited for)."""
    path = MODULES.path(NAMESPACE, made.name)
    await api.request(
        "PATCH", path, body={"metadata": {"finalizers": None}}, content_type=kube_client.MERGE_PATCH
    )
    await api.request("DELETE", path)  # the garbage collector takes its DaemonSets and pods
    gone = {labels.KERNEL_VERSION_FULL: None, labels.ready(NAMESPACE, made.name): None}
    await _all(
        [
            lambda n=n: api.request(
                "PATCH",
                resources.NODES.path(name=n),
                body={"metadata": {"labels": gone}},
                content_type=kube_client.MERGE_PATCH,
            )
            for n in nodes
        ]
    )
    deadline = time.monotonic() + 600
    for what in (resources.PODS, resources.DAEMONSETS, MODULES):
        while (await api.request("GET", what.path(NAMESPACE)))["items"]:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what.plural} of {made.name} never went")
            await asyncio.sleep(0.2)


async def floor(
    api: client.ApiClient, made: Converged, nodes: list[str], body: dict[str, Any]
) -> float:
    """The same Module, DaemonSets, node labels and status, written directly
    (16 in flight) as the cluster allows: ``.ready`` on a node once its
    loader pod is Ready (seen on a watch), the status once all are."""
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    merge = "application/merge-patch+json"
    ready_key = labels.ready(NAMESPACE, made.name)
    listing = await core.list_namespaced_pod(NAMESPACE, _preload_content=False)
    since = json.loads(await listing.read())["metadata"]["resourceVersion"]
    watch = await core.list_namespaced_pod(
        NAMESPACE, watch=True, resource_version=since, _preload_content=False
    )
    limit = asyncio.Semaphore(PARALLEL)
    labelled: set[str] = set()
    pending: list[asyncio.Future[Any]] = []

    async def send(call: Callable[[], Awaitable[Any]]) -> None:
        async with limit:
            await call()

    def later(call: Callable[[], Awaitable[Any]]) -> None:
        pending.append(asyncio.ensure_future(send(call)))

    try:
        started = time.perf_counter()
        module = await custom.create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, NAMESPACE, modules.PLURAL, body
        )
        owner = {
            "apiVersion": modules.API_VERSION,
            "kind": modules.KIND,
            "name": made.name,
            "uid": module["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        later(
            lambda: custom.patch_namespaced_custom_object(
                modules.GROUP, modules.VERSION, NAMESPACE, modules.PLURAL, made.name,
                {"metadata": {"finalizers": [labels.FINALIZER]}}, _content_type=merge,
            )
        )  # fmt: skip
        for daemonset in made.daemonsets:
            owned = {**daemonset, "metadata": {**daemonset["metadata"], "ownerReferences": [owner]}}
            later(lambda d=owned: apps.create_namespaced_daemon_set(NAMESPACE, d))
        for node in nodes:
            kernel = {labels.KERNEL_VERSION_FULL: made.kernels[node]}
            later(
                lambda n=node, k=kernel: core.patch_node(
                    n, {"metadata": {"labels": k}}, _content_type=merge
                )
            )
        async for line in watch.content:
            pod = json.loads(line)["object"]
            node = (pod.get("spec") or {}).get("nodeName")
            conditions = (pod.get("status") or {}).get("conditions") or ()
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if node and ready and node not in labelled:
                labelled.add(node)
                later(
                    lambda n=node: core.patch_node(
                        n, {"metadata": {"labels": {ready_key: ""}}}, _content_type=merge
                    )
                )
                if len(labelled) == len(nodes):
                    break
        await asyncio.gather(*pending)
        await custom.patch_namespaced_custom_object_status(
            modules.GROUP, modules.VERSION, NAMESPACE, modules.PLURAL, made.name,
            {"status": made.status}, _content_type=merge,
        )  # fmt: skip
        return time.perf_counter() - started
    finally:
        watch.close()


def realistic_node(name: str, index: int) -> dict[str, Any]:
    """A Node as a kubelet would report it (minus the churn), without the KWOK annotation."""
    kernel = KERNELS[index % len(KERNELS)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m5.2xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[index % 3]}",
                "type": "bare",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": f"10.{index // 250}.{index % 250}.0/24", "providerID": f"aws:///{name}"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32475340Ki", "pods": "110", "ephemeral-storage": "104845292Ki"},
            "allocatable": {"cpu": "7910m", "memory": "31458508Ki", "pods": "110", "ephemeral-storage": "95551679124"},
            "conditions": [
                {"type": t, "status": "False", "reason": f"Kubelet{t}", "message": f"kubelet reports no {t}",
                 "lastHeartbeatTime": "2026-11-30T10:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                  "lastHeartbeatTime": "2026-11-30T10:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
            "addresses": [
                {"type": "InternalIP", "address": f"10.1.{index // 250}.{index % 250}"},
                {"type": "Hostname", "address": name},
                {"type": "InternalDNS", "address": f"{name}.eu-west-1.compute.internal"},
            ],
            "nodeInfo": {
                "machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()), "bootID": str(uuid.uuid4()),
                "kernelVersion": kernel, "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.35.0", "kubeProxyVersion": "v1.35.0", "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": [
                {"names": [f"registry.example.com/team/image-{j}@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}",
                           f"registry.example.com/team/image-{j}:v{j}.0"], "sizeBytes": 10_000_000 + j}
                for j in range(20)
            ],
        },
    }  # fmt: skip


async def create_bare_nodes(api: client.ApiClient, count: int) -> None:
    core = client.CoreV1Api(api)
    limit = asyncio.Semaphore(32)

    async def one(index: int) -> None:
        async with limit:
            await core.create_node(realistic_node(f"bare-{index:05d}", index))

    await asyncio.gather(*(one(i) for i in range(count)))


def baseline_rss() -> float:
    """RSS of a process that has imported what ``kmm operator`` imports, and nothing more:
    the command line with its operator command registered (``kmm.cli.operating``, which
    brings the operator, its flags' parsers and checks)."""
    code = (
        "import kmm.cli\n"
        "kmm.cli.build('operator')\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def _rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _metric(port: int, name: str, label: str) -> float | None:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            text = await response.text()
    except aiohttp.ClientError:
        return None
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def operator_rss(
    kubeconfig: pathlib.Path, nodes: int, log: pathlib.Path
) -> tuple[float, float]:
    """(RSS once synced with ``nodes`` Nodes cached, RSS after 10 s more)."""
    port = 18080 + os.getpid() % 1000
    argv = [str(pathlib.Path(sys.executable).with_name("kmm")), "operator", f"--kubeconfig={kubeconfig}",
            f"--metrics-port={port}", f"--health-port={port}", "--bind-address=127.0.0.1",
            "--no-leader-election"]  # fmt: skip
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    try:
        while True:
            if await _metric(port, "kmm_cached_objects", 'informer="nodes"') == nodes:
                break
            if process.returncode is not None:
                raise SystemExit(f"operator exited: {log.read_text()[-2000:]}")
            await asyncio.sleep(0.5)
        while True:
            if await _metric(port, "controller_runtime_reconcile_total", 'result="success"'):
                break
            await asyncio.sleep(0.5)
        synced = _rss_mib(process.pid)
        await asyncio.sleep(10)
        return synced, _rss_mib(process.pid)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def end_state(api: kube_client.Client, name: str) -> dict[str, Any]:
    """What convergence leaves: each node's kernel and ``.ready`` labels,
    where loader pods run (kernel, image) and are Ready, the DaemonSets'
    names and node selectors, the Module's finalizers and status. The
    operator's run and the floor must leave the same."""
    ready_key = labels.ready(NAMESPACE, name)
    listed = await api.request("GET", resources.NODES.path())
    pods = (await api.request("GET", resources.PODS.path(NAMESPACE)))["items"]
    daemonsets = (await api.request("GET", resources.DAEMONSETS.path(NAMESPACE)))["items"]
    module = await api.request("GET", MODULES.path(NAMESPACE, name))
    return {
        "nodes": {
            n["metadata"]["name"]: {
                k: v
                for k, v in (n["metadata"].get("labels") or {}).items()
                if k in (labels.KERNEL_VERSION_FULL, ready_key)
            }
            for n in listed["items"]
        },
        "pods": sorted(
            (
                str(p["spec"].get("nodeName")),
                (p["metadata"].get("labels") or {}).get(labels.KERNEL_VERSION_FULL, ""),
                (p["metadata"].get("labels") or {}).get(labels.IMAGE_HASH, ""),
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (p.get("status") or {}).get("conditions") or ()
                ),
            )
            for p in pods
        ),
        "daemonsets": sorted(
            (d["metadata"]["name"], json.dumps(d["spec"]["template"]["spec"]["nodeSelector"]))
            for d in daemonsets
        ),
        "finalizers": module["metadata"].get("finalizers"),
        "status": module.get("status"),
    }


async def install(kmm_api: kube_client.Client, api: client.ApiClient) -> None:
    # Every CRD (Module, PreflightValidation): the operator watches both.
    docs = [
        doc
        for path in sorted((DEPLOY / "crd").glob("*.yaml"))
        for doc in applying.load_documents(path.read_text())
    ]
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    await applying.apply_documents(kmm_api, docs)
    deadline = time.monotonic() + 120
    while True:  # the CRD serves once Established
        try:
            await client.CustomObjectsApi(api).list_namespaced_custom_object(
                modules.GROUP, modules.VERSION, NAMESPACE, modules.PLURAL
            )
            break
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    await cluster.wait_default_account(kmm_api, NAMESPACE, timeout=120)


@dataclasses.dataclass
class Measured:
    total: float
    pods_ready: float
    counts: Counter[tuple[str, str]]
    made: Converged
    floor_time: float
    floor_writes: int
    operator_end: dict[str, Any]
    floor_end: dict[str, Any]


async def measure(
    kmm_api: kube_client.Client, api: client.ApiClient, kubeconfig: pathlib.Path, nodes: list[str]
) -> Measured:
    """The operator converges a Module; undone; the floor converges it again."""
    name, total, pods_ready, counts = await converge(api, kubeconfig, len(nodes))
    operator_end = await end_state(kmm_api, name)
    made = await capture(kmm_api, name)
    await reset(kmm_api, made, nodes)
    floor_time = await floor(api, made, nodes, module_body(name))
    # finalizer, DaemonSets, kernel and .ready labels, status (the Module's create apart)
    floor_writes = 1 + len(made.daemonsets) + 2 * len(made.kernels) + 1
    floor_end = await end_state(kmm_api, name)
    return Measured(
        total, pods_ready, counts, made, floor_time, floor_writes, operator_end, floor_end
    )


async def main(args: argparse.Namespace) -> None:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="kmm-bench-"))
    cache = pathlib.Path(os.environ.get("KMM_CACHE_DIR", pathlib.Path.home() / ".cache" / "kmm"))
    options = cluster.Options(
        directory=directory, cache_dir=cache, nodes=args.nodes, kernels=KERNELS, start_timeout=600
    )
    started = time.perf_counter()
    record = await cluster.up(options)
    print(
        f"sandbox: {args.nodes} KWOK nodes, {len(KERNELS)} kernels, up in {time.perf_counter() - started:.1f} s"
    )
    try:
        independent = await independent_client(record.kubeconfig)
        async with cluster.api_client(record.kubeconfig) as kmm_api, independent as api:
            await install(kmm_api, api)
            found = await measure(kmm_api, api, record.kubeconfig, record.node_names)
            if found.operator_end != found.floor_end:
                raise SystemExit(
                    f"the floor did not end where the operator did:\n{found.operator_end}\n"
                    f"{found.floor_end}"
                )
            total, pods_ready, counts = found.total, found.pods_ready, found.counts
            written = sum(counts.values())
            print(
                f"converged: {total:.2f} s from create to {args.nodes} .ready labels + status Ready"
            )
            print(
                f"  last loader pod Ready at {pods_ready:.2f} s (cluster); operator lag after it {total - pods_ready:.2f} s"
            )
            print(f"  operator API writes: {written}")
            for (verb, resource), count in sorted(counts.items()):
                print(f"    {verb:6} {resource:40} {count}")
            floor_time, floor_writes = found.floor_time, found.floor_writes
            print(
                f"floor: the same Module, {len(found.made.daemonsets)} DaemonSets, node labels and"
                f" status written directly ({PARALLEL} in flight), the same {args.nodes} pods"
                f" waited for, the same end: {floor_time:.2f} s, {floor_writes} writes"
            )
            print(
                f"  ratio converge/floor: {total / floor_time:.2f}x;"
                f" writes operator/floor {written / floor_writes:.2f}x;"
                f" writes/node {written / args.nodes:.2f}"
            )

            extra = args.cached_nodes - args.nodes
            if extra > 0:
                t0 = time.perf_counter()
                await create_bare_nodes(api, extra)
                print(f"created {extra} bare realistic Nodes in {time.perf_counter() - t0:.1f} s")
        synced, later = await operator_rss(
            record.kubeconfig, args.cached_nodes, directory / "operator.log"
        )
        print(
            f"operator RSS with {args.cached_nodes} Nodes cached (+{args.nodes} pods, 5 DaemonSets, 1 Module):"
            f" {synced:.1f} MiB once synced and reconciled, {later:.1f} MiB 10 s later"
        )
        print(f"  of which imports alone (what kmm operator imports): {baseline_rss():.1f} MiB")  # fmt: skip
    finally:
        cluster.down(directory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--cached-nodes", type=int, default=5000)
    asyncio.run(main(parser.parse_args()))
