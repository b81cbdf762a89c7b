"""Control-plane outages while the operator converges a Module over 100 KWOK
nodes, on a sandbox of this module's own: the API server stopped and started
again, then etcd. The operator (``running.run``: its real HTTP endpoints)
reports not ready while the API server is gone, reconnects, relists and
converges: one DaemonSet per kernel, never a duplicate, every node's labels
right. The writes it sent are printed (``-s``) for the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.kube import client as kube_client
from kmm.kube import counting, kubeconfigs
from kmm.kube import errors as kube_errors
from kmm.operator import running
from kmm.sandbox import cluster, ports, testing

NODES = 100
KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")


@pytest.fixture(scope="module")
def crowded() -> Iterator[testing.RunningSandbox]:
    with support.own_sandbox("ko", nodes=NODES, kernels=KERNELS) as sandbox:
        yield sandbox


@dataclasses.dataclass
class Operator:
    url: str
    counter: counting.RequestCounter

    async def ready(self) -> bool:
        """/readyz answered 200 (False too before its server listens)."""
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{self.url}/readyz") as answer,
            ):
                return answer.status == 200
        except aiohttp.ClientConnectionError:
            return False


@contextlib.asynccontextmanager
async def _operator(kubeconfig: Path) -> AsyncIterator[Operator]:
    (port,) = ports.free_ports(1)
    settings = running.Settings(
        identity="outages", election=None, metrics_port=port, health_port=port, host="127.0.0.1"
    )
    async with kube_client.Client(kubeconfigs.load(kubeconfig)) as api:
        stop = asyncio.Event()
        task = asyncio.ensure_future(running.run(api, settings, stop))
        try:
            found = Operator(f"http://127.0.0.1:{port}", api.counter)
            await testing.eventually(found.ready, "the operator ready")
            yield found
        finally:
            stop.set()
            await task


async def _labels_right(api: client.ApiClient, namespace: str, name: str) -> None:
    """Every node: the module's ready label, and its kernel label from its kernel."""
    listing = await client.CoreV1Api(api).list_node()
    assert len(listing.items) == NODES
    ready = labels.ready(namespace, name)
    for node in listing.items:
        kernel = kernels.node_kernel(node.status.node_info.kernel_version)
        assert node.metadata.labels[labels.KERNEL_VERSION_FULL] == labels.kernel_value(kernel)
        assert node.metadata.labels[ready] == ""


async def _converge_through(
    crowded: testing.RunningSandbox, component: str, *, down: str
) -> dict[tuple[str, str], int]:
    """Create a Module over every node, stop ``component`` as soon as the first
    DaemonSet exists, wait (in the outage) for ``down``, start it again; check
    the cluster converged. Returns the writes the operator sent."""
    checker = await support.independent_client(crowded.kubeconfig)
    async with (
        checker,
        support.own_namespace(checker, "outage") as namespace,
        _operator(crowded.kubeconfig) as operator,
        cluster.api_client(crowded.kubeconfig) as admin,
    ):
        name = "everywhere"
        await client.CustomObjectsApi(checker).create_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            namespace,
            modules.PLURAL,
            support.module_body(name, {"type": "kwok"}),
        )

        async def begun() -> bool:
            return bool(await support.loader_daemonsets(checker, namespace))

        await testing.eventually(begun, "the first loader DaemonSet")
        key = labels.ready(namespace, name)
        loaded = sum(key in found for found in (await support.node_labels(checker)).values())
        print(f"\n{component} stopped with the module loaded on {loaded}/{NODES} nodes")
        async with crowded.stopped(component):
            if down == "operator not ready":

                async def not_ready() -> bool:
                    return not await operator.ready()

                await testing.eventually(not_ready, "/readyz 503 while the API server is down")
            else:

                async def server_not_ready() -> bool:
                    try:
                        await admin.send("GET", "/readyz", timeout=5)
                    except kube_errors.ApiError:
                        return True
                    return False

                await testing.eventually(server_not_ready, "the API server sees etcd gone")
        everywhere = {
            node.metadata.name for node in (await client.CoreV1Api(checker).list_node()).items
        }
        await testing.eventually(
            lambda: support.converged(checker, namespace, name, everywhere),
            f"converged over {NODES} nodes after the {component} outage",
            bound=240,
        )
        await testing.eventually(operator.ready, "the operator ready again")
        daemonsets = await support.loader_daemonsets(checker, namespace)
        assert sorted(d.metadata.labels[labels.KERNEL_VERSION_FULL] for d in daemonsets) == sorted(
            labels.kernel_value(kernels.node_kernel(k)) for k in KERNELS
        )
        await _labels_right(checker, namespace, name)
        writes = dict(operator.counter.writes)
        print(f"\n{component} outage: operator writes {sorted(writes.items())}")
        await support.delete_and_wait_clean(checker, namespace, name)
    return writes


async def test_the_api_server_restarted_mid_convergence(crowded: testing.RunningSandbox) -> None:
    writes = await _converge_through(crowded, "kube-apiserver", down="operator not ready")
    # Every node was labelled by a patch of its own. Patches sent into the
    # outage count too (attempts): the cluster state above is the proof.
    assert writes[("PATCH", "nodes")] >= NODES


async def test_etcd_restarted_mid_convergence(crowded: testing.RunningSandbox) -> None:
    writes = await _converge_through(crowded, "etcd", down="server not ready")
    assert writes[("PATCH", "nodes")] >= NODES
