"""Kernel-mapping regexps on the sandbox: Go's dialect, and no pattern stalls
the operator (matching is RE2's, linear in the kernel string).

Each test selects nodes with a label of its own and runs the operator in
process, as the other operator tests do.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from collections.abc import AsyncIterator

import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.runtime import controllers
from kmm.sandbox import cluster, testing
from kmm.sandbox.kwoknodes import nodes

manifests = support.manifests

RHEL_KERNEL = "5.14.0-427.13.1.el9_4.x86_64"
# Python's re backtracks exponentially on it against RHEL_KERNEL (never
# finishing); Go's regexp and RE2 answer "no match" in linear time.
BACKTRACKING = r"(([\w.]+)+)+!"


def _loader(regexp: str, image: str) -> dict[str, object]:
    return {
        "container": {
            "modprobe": {"moduleName": "kmm_test"},
            "kernelMappings": [{"regexp": regexp, "containerImage": image}],
        }
    }


async def _ready(api: client.ApiClient, namespace: str, name: str, count: int) -> bool:
    module = await support.get_module(api, namespace, name)
    ready = support.condition(module, "Ready")
    loader = ((module or {}).get("status") or {}).get("moduleLoader") or {}
    return (
        ready is not None and ready["status"] == "True" and loader.get("availableNumber") == count
    )


async def test_unicode_class_mapping_converges(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    select = f"kmm-test/{namespace}"
    chosen = [sandbox.node_names[0]]  # 6.8.0-45-generic
    body = support.module_body(
        "digits",
        {select: "yes"},
        moduleLoader=_loader(r"^\p{N}+\.\p{N}+\.\p{N}+-\p{N}+-generic$", "r.io/n:${KERNEL_XYZ}"),
    )
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig),
    ):
        await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
        )
        await testing.eventually(lambda: _ready(api_client, namespace, "digits", 1), "Ready")
        [daemonset] = await support.loader_daemonsets(api_client, namespace)
        assert daemonset.spec.template.spec.containers[0].image == "r.io/n:6.8.0"
        found = await support.node_labels(api_client)
        assert labels.ready(namespace, "digits") in found[chosen[0]]
        await support.delete_and_wait_clean(api_client, namespace, "digits")


class _Log:
    """Records each reconcile's key as it ends."""

    def __init__(self, inner: controllers.Reconciler) -> None:
        self.inner = inner
        self.ended: list[str] = []

    async def reconcile(self, key: str) -> controllers.Result:
        try:
            return await self.inner.reconcile(key)
        finally:
            self.ended.append(key)


@contextlib.asynccontextmanager
async def _rhel_nodes(
    api: client.ApiClient, kubeconfig: pathlib.Path, count: int
) -> AsyncIterator[list[str]]:
    names = [f"kmm-rhel-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    async with cluster.api_client(kubeconfig) as kmm_api:
        await nodes.create(kmm_api, [(name, RHEL_KERNEL) for name in names])
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name)


async def test_backtracking_pattern_neither_matches_nor_delays_another_module(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    select = f"kmm-test/{namespace}"
    slow = support.module_body(
        "slow", {select: "rhel"}, moduleLoader=_loader(BACKTRACKING, "r.io/s:1")
    )
    fast = support.module_body("fast", {select: "yes"})
    chosen = sandbox.node_names[:2]
    objects = client.CustomObjectsApi(api_client)
    async with (
        _rhel_nodes(api_client, sandbox.kubeconfig, 2) as rhel,
        support.selecting(api_client, rhel, select, "rhel"),
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        log = _Log(running.op.counting.inner)
        running.op.counting.inner = log
        for body in (slow, fast):  # the slow one is queued first
            await objects.create_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
            )
        await testing.eventually(lambda: _ready(api_client, namespace, "fast", 2), "fast Ready")
        # Both were reconciled, the slow one to its end before the fast one was
        # seen Ready: a backtracking match would have held the event loop.
        assert log.ended.count(f"{namespace}/slow") >= 1
        assert log.ended.count(f"{namespace}/fast") >= 1
        module = await support.get_module(api_client, namespace, "slow")
        status = (module or {}).get("status") or {}
        assert status["moduleLoader"]["nodesMatchingSelectorNumber"] == 2
        assert status["moduleLoader"]["desiredNumber"] == 0
        assert [
            d.metadata.name
            for d in await support.loader_daemonsets(api_client, namespace)
            if d.metadata.labels[labels.MODULE_NAME] == "slow"
        ] == []
        for name in ("fast", "slow"):  # each waits for all DaemonSets to go
            await support.delete_and_wait_clean(api_client, namespace, name)
