"""The operator under what the API server does to it (issue 16), on a sandbox of
this module's own whose API server compacts etcd every second, serves
watches from etcd (no watch cache) and admits one write at a time from
anyone but system:masters:

- a watch expired by compaction (a real 410) is relisted, and nothing that
  changed while the operator was cut off is missed, DRA Modules included;
- throttled (429 with Retry-After) while something else holds the write
  slot part of the time, the operator, impersonating its ServiceAccount,
  backs off and converges with no write lost;
- two replicas, the API server gone for longer than the lease: the leader
  sends no write past its renew deadline, and after the restart exactly
  one replica writes.

Each test makes nodes of its own (``sandbox.nodes``) and deletes them, so
the order of the tests does not matter. The faults come from the real
server (``partitioning``, ``throttling``, ``restarting``); the counts come
from the operator's own metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
import test_operator_dra as dra
import test_operator_support as support
import test_sandbox_lifecycle as lifecycle
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.cli import applying, paths
from kmm.kube import client as kube_client
from kmm.kube import errors, reflecting
from kmm.sandbox import cluster, nodes, testing

KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")
COMPACTION = 1.0
SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"
HOLDER = "kmm-test-slot-holder"
SEED = 16


@pytest.fixture(scope="module")
def faults() -> Iterator[testing.RunningSandbox]:
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="kof", dir="/tmp")))
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=1,
        kernels=KERNELS,
        etcd_compaction_interval=COMPACTION,
        watch_cache=False,
        max_mutating_requests_inflight=1,
    )
    record = asyncio.run(cluster.up(options))
    try:
        asyncio.run(_install(record.kubeconfig))
        yield testing.RunningSandbox.of(record, KERNELS)
    finally:
        cluster.down(directory)
        left = lifecycle.processes_mentioning(directory)
        shutil.rmtree(directory, ignore_errors=True)
        assert left == [], f"processes left running: {left}"


async def _install(kubeconfig: Path) -> None:
    """The CRD, admission policy, operator namespace and RBAC from deploy/."""
    await support.install_manifests(kubeconfig)
    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    async with cluster.api_client(kubeconfig) as api:
        await applying.apply_documents(api, docs)


@pytest.fixture
async def checker(faults: testing.RunningSandbox) -> AsyncIterator[client.ApiClient]:
    """A client that is not kmm's, as the admin (never throttled)."""
    api = await support.independent_client(faults.kubeconfig)
    async with api:
        yield api


@contextlib.asynccontextmanager
async def own_nodes(
    faults: testing.RunningSandbox, prefix: str, count: int
) -> AsyncIterator[list[str]]:
    """``count`` fresh KWOK nodes, kernels round robin over KERNELS; deleted after."""
    made = nodes.spread(count, KERNELS, prefix=f"{prefix}-{uuid.uuid4().hex[:4]}")
    names = [name for name, _ in made]
    async with cluster.api_client(faults.kubeconfig) as api:
        await nodes.create(api, made)
        await nodes.wait_ready(api, names, timeout=120)
        try:
            yield names
        finally:
            for name in names:
                with contextlib.suppress(errors.NotFound):
                    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def label(api: client.ApiClient, node: str, change: dict[str, str | None]) -> None:
    await client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": change}})


def kernel_of(node: str, names: Sequence[str]) -> str:
    return KERNELS[names.index(node) % len(KERNELS)]


async def loader_images(api: client.ApiClient, namespace: str) -> dict[str, list[str]]:
    """Kernel label -> images of the loader DaemonSets for it (a duplicate shows as two)."""
    found: dict[str, list[str]] = {}
    for daemonset in await support.loader_daemonsets(api, namespace):
        kernel = daemonset.metadata.labels[labels.KERNEL_VERSION_FULL]
        image = daemonset.spec.template.spec.containers[0].image
        found.setdefault(kernel, []).append(image)
    return found


def moved_literal(images: dict[str, list[str]], kernels_: set[str]) -> dict[str, list[str]]:
    """``images`` for ``kernels_``, the literal mapping's image moved to ``example.com/moved``."""
    return {
        kernel: [image.replace("example.com/literal/", "example.com/moved/") for image in found]
        for kernel, found in images.items()
        if kernel in kernels_
    }


def kernel_labels(nodes_: set[str], names: Sequence[str]) -> set[str]:
    return {labels.kernel_value(kernels.node_kernel(kernel_of(n, names))) for n in nodes_}


# -- 410: a watch expired by compaction --------------------------------------


async def _compacted(api: kube_client.Client, version: str) -> bool:
    """Whether etcd no longer has ``version`` (a list at exactly it is 410)."""
    try:
        await api.request(
            "GET",
            "/api/v1/namespaces/default/configmaps",
            query={"resourceVersion": version, "resourceVersionMatch": "Exact", "limit": 1},
        )
    except errors.Gone:
        return True
    return False


async def test_a_watch_expired_by_compaction_is_relisted_and_nothing_missed(
    faults: testing.RunningSandbox, checker: client.ApiClient
) -> None:
    async with (
        support.own_namespace(checker, "gap") as namespace,
        own_nodes(faults, "gap", 8) as names,
        faults.partition() as partition,
        support.operator_in_process(faults.kubeconfig, through=partition) as running,
        cluster.api_client(faults.kubeconfig) as admin,
    ):
        n = names
        loader_key, dra_key = f"kmm-test/{namespace}-loader", f"kmm-test/{namespace}-dra"
        for node in (n[0], n[1], n[2], n[3], n[7]):
            await label(checker, node, {loader_key: "yes"})
        for node in (n[4], n[5], n[6]):
            await label(checker, node, {dra_key: "yes"})
        objects = client.CustomObjectsApi(checker)
        await objects.create_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            namespace,
            modules.PLURAL,
            support.module_body("loader", {loader_key: "yes"}),
        )
        await dra.create(checker, namespace, dra.dra_body("drv", dra_key, namespace, loader=False))
        before = {n[0], n[1], n[2], n[3], n[7]}

        async def first() -> bool:
            return (
                await support.converged(checker, namespace, "loader", before)
                and await dra.labelled(checker, labels.dra_target(namespace, "drv"))
                == {n[4], n[5], n[6]}
                and len(await dra.our_classes(checker, namespace, "drv")) == 2
            )

        await testing.eventually(first, "both Modules converged before the partition")
        images = await loader_images(checker, namespace)
        assert all(len(found) == 1 for found in images.values())

        partition.cut()
        versions = {i.name: i.resource_version for i in running.op.informers()}
        # While the operator is cut off: nodes leave, join, go; a Module changes.
        await label(checker, n[0], {loader_key: None})
        await label(checker, n[4], {loader_key: "yes", dra_key: None})
        await label(checker, n[3], {dra_key: "yes"})
        await client.CoreV1Api(checker).patch_node(n[6], {"spec": {"unschedulable": True}})
        await admin.request("DELETE", f"/api/v1/nodes/{n[7]}")
        changed = support.module_body("loader", {loader_key: "yes"})
        mappings = changed["spec"]["moduleLoader"]["container"]["kernelMappings"]
        mappings[0]["containerImage"] = "example.com/moved/kmm-test:${KERNEL_XYZ}"
        await dra.patch_spec(
            checker,
            namespace,
            "drv",
            {
                "dra": {
                    **dra.dra_spec(namespace),
                    "deviceClasses": [
                        {"name": f"{namespace}-any"},
                        {"name": f"{namespace}-renamed"},
                    ],
                }
            },
        )
        await dra.patch_spec(checker, namespace, "loader", changed["spec"])
        newest = max(int(v) for v in versions.values() if v)
        await testing.eventually(
            lambda: _compacted(admin, str(newest)),
            f"the operator's resourceVersions (up to {newest}) compacted away",
            interval=COMPACTION,
        )
        partition.heal()

        after = {n[1], n[2], n[3], n[4]}

        async def healed() -> bool:
            module = await support.get_module(checker, namespace, "loader")
            matching = ((module or {}).get("status") or {}).get("moduleLoader") or {}
            classes = {c.metadata.name for c in await dra.our_classes(checker, namespace, "drv")}
            return (
                await support.converged(checker, namespace, "loader", after)
                and matching.get("nodesMatchingSelectorNumber") == len(after)
                and await loader_images(checker, namespace)
                == moved_literal(images, kernel_labels(after, n))
                and await dra.labelled(checker, labels.dra_target(namespace, "drv"))
                == {n[3], n[4], n[5]}
                and classes == {f"{namespace}-any", f"{namespace}-renamed"}
                and len(await dra.dra_daemonsets(checker, namespace)) == 1
            )

        await testing.eventually(healed, "everything changed in the gap seen", bound=180)
        relists = support.metric(running.metrics(), "kmm_informer_relists_total")
        gone = {
            dict(key)["informer"]: value
            for key, value in relists.items()
            if dict(key)["reason"] == reflecting.GONE
        }
        print(f"\nrelists after 410: {sorted(gone.items())}; partition {partition.refused} refused")
        # Every informer's watch came back to a compacted version: each got
        # its 410 from the server and listed again.
        assert set(gone) == set(versions)
        assert all(value >= 1 for value in gone.values())
        await support.delete_and_wait_clean(checker, namespace, "loader")
        await delete_and_wait_gone(checker, namespace, "drv")


async def delete_and_wait_gone(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a Module while the operator runs and wait until its finalizer let it go."""
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
    )

    async def gone() -> bool:
        return await support.get_module(api, namespace, name) is None

    await testing.eventually(gone, f"Module {name} deleted")
