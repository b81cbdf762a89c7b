"""One tenant cannot touch another's Module by labelling its own objects.

On the session sandbox (control plane and KWOK nodes), with the operator in
process: a tenant, in a namespace of its own, creates objects that carry the
labels of a victim Module of another namespace. Each test plants one such
object and checks the victim is untouched by it:

1. a DaemonSet labelled as the victim's loader and named like an unrelated
   DaemonSet of the victim's namespace (``fluentd``): nothing of the
   victim's namespace is deleted, the planted one is neither deleted nor
   counted;
2. a pod named as the victim's build pod: the victim's build still runs
   (its own build pod is made);
3. a pod labelled as the victim's loader pod: the victim's deletion is not
   held by it;
4. a Ready pod labelled as the victim's loader pod, on a node the victim's
   own loader cannot run on: the node does not look loaded (no ``.ready``).

The operator reconciles the victim with the planted object in its caches
(waited for, then a resync), so a hostile object that the event mapping
ignores is still seen by the reconcile.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import test_operator_support as support
from aiohttp import test_utils, web
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.operator.build import podnames
from kmm.sandbox import testing

manifests = support.manifests

Obj = dict[str, Any]

# Matches no node: a planted object that must not run anywhere.
_NOWHERE = {"kmm-tenancy/nowhere": "yes"}


def _victim_labels(namespace: str, name: str, role: str, **extra: str) -> dict[str, str]:
    return {
        labels.MODULE_NAME: name,
        labels.MODULE_NAMESPACE: namespace,
        labels.ROLE: role,
        **extra,
    }


def _pod(name: str, pod_labels: dict[str, str], **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {"containers": [{"name": "c", "image": "example.com/pause:1"}], **spec},
    }


def _daemonset(name: str, ds_labels: dict[str, str]) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": ds_labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": _NOWHERE,
                    "containers": [{"name": "c", "image": "example.com/fluentd:1"}],
                },
            },
        },
    }


def _shapes(daemonsets: list[Any]) -> dict[str, tuple[int, dict[str, str], bool]]:
    """uid -> (generation, labels, being deleted) of each DaemonSet."""
    return {
        ds.metadata.uid: (
            ds.metadata.generation,
            dict(ds.metadata.labels or {}),
            ds.metadata.deletion_timestamp is not None,
        )
        for ds in daemonsets
    }


async def _seen_and_reconciled(running: support.InProcess, store_key: str, what: str) -> None:
    """Wait until the operator's caches hold the planted object, then make it
    reconcile every Module with it there."""
    stores = (running.op.daemonsets.store, running.op.pods.store)

    async def cached() -> bool:
        return any(store.get(store_key) is not None for store in stores)

    await testing.eventually(cached, f"{what} in the operator's cache")
    running.op.resync()
    await running.wait_idle(f"reconciled with {what}")


async def test_a_planted_daemonset_elsewhere_deletes_nothing_and_is_not_counted(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "victim"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:1]
    apps = client.AppsV1Api(api_client)
    own = await apps.create_namespaced_daemon_set(
        namespace, _daemonset("fluentd", {"app": "fluentd"})
    )
    async with (
        support.own_namespace(api_client, "tenant") as tenant,
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await support.create_module(
            api_client, namespace, support.module_body(name, {select: "yes"})
        )
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, set(chosen)), "victim loaded"
        )
        kernel = kernels.node_kernel(sandbox.kernels[0])
        planted_labels = _victim_labels(
            namespace,
            name,
            "module-loader",
            **{labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel)},
        )
        planted = await apps.create_namespaced_daemon_set(
            tenant, _daemonset("fluentd", planted_labels)
        )
        victims = _shapes(await support.loader_daemonsets(api_client, namespace))
        await _seen_and_reconciled(running, f"{tenant}/fluentd", "the planted DaemonSet")

        # Nothing of either namespace was deleted or written: the same
        # objects, their specs and labels as they were (the DaemonSet
        # controller writes their status meanwhile; the operator's own
        # counter would also count its writes for other tests' Modules
        # still being cleaned up in this session's sandbox).
        still = await apps.read_namespaced_daemon_set("fluentd", namespace)
        assert _shapes([still]) == _shapes([own])
        kept = await apps.read_namespaced_daemon_set("fluentd", tenant)
        assert _shapes([kept]) == _shapes([planted])
        assert _shapes(await support.loader_daemonsets(api_client, namespace)) == victims
        # Not counted: the victim's loader status is its one node's, as before.
        assert await support.converged(api_client, namespace, name, set(chosen))
        loaders = await support.loader_daemonsets(api_client, namespace)
        assert len(loaders) == 1
        await support.delete_and_wait_clean(api_client, namespace, name)


class _MissingImages:
    """A registry on loopback that has no image: every manifest is unknown."""

    def __init__(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.server = test_utils.TestServer(app, host="127.0.0.1")
        self.asked = 0

    async def _answer(self, request: web.Request) -> web.Response:
        if request.path in ("/v2", "/v2/"):
            return web.json_response({})
        self.asked += "/manifests/" in request.path
        errors = [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]
        return web.json_response({"errors": errors}, status=404)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@contextlib.asynccontextmanager
async def _missing_images() -> AsyncIterator[_MissingImages]:
    registry = _MissingImages()
    await registry.server.start_server()
    try:
        yield registry
    finally:
        await registry.server.close()


def _building_module(name: str, selector: dict[str, str], kernel: str) -> Obj:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name},
        "spec": {
            "selector": selector,
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmm_test"},
                    "kernelMappings": [
                        {
                            "literal": kernel,
                            "containerImage": "registry.tenancy.test/kmm-test:${KERNEL_FULL_VERSION}",
                            "build": {"dockerfileConfigMap": {"name": "dockerfile"}},
                            "registryTLS": {"insecure": True},
                        }
                    ],
                }
            },
        },
    }


async def _images(api: client.ApiClient, namespace: str, name: str) -> list[Obj]:
    found = await support.get_module(api, namespace, name)
    return list(((found or {}).get("status") or {}).get("images") or ())


async def test_a_planted_build_pod_elsewhere_does_not_hold_the_build(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "victim"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:1]
    kernel = kernels.node_kernel(sandbox.kernels[0])
    pod_name = podnames.pod_name(name, "build", kernel)
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="dockerfile"), data={"dockerfile": "FROM scratch\n"}
        ),
    )
    async with (
        support.own_namespace(api_client, "tenant") as tenant,
        _missing_images() as registry,
        support.selecting(api_client, chosen, select),
        support.operator_in_process(
            sandbox.kubeconfig, registry_endpoints={"registry.tenancy.test": registry.endpoint}
        ) as running,
    ):
        planted_labels = _victim_labels(namespace, name, "build")
        await core.create_namespaced_pod(
            tenant, _pod(pod_name, planted_labels, nodeSelector=_NOWHERE)
        )
        await _seen_and_reconciled(running, f"{tenant}/{pod_name}", "the planted build pod")
        await support.create_module(
            api_client, namespace, _building_module(name, {select: "yes"}, kernel)
        )

        async def building() -> bool:
            return any(
                i.get("state") == "Building" for i in await _images(api_client, namespace, name)
            )

        await testing.eventually(building, "the victim's image Building")
        assert registry.asked > 0
        # Its own build pod, beside it and controlled by it: the planted one held nothing.
        module = await support.get_module(api_client, namespace, name)
        assert module is not None
        own = await core.read_namespaced_pod(pod_name, namespace)
        controller = [r for r in own.metadata.owner_references or () if r.controller]
        assert [(r.kind, r.uid) for r in controller] == [("Module", module["metadata"]["uid"])]
        planted = await core.read_namespaced_pod(pod_name, tenant)
        assert planted.metadata.deletion_timestamp is None
        await support.delete_and_wait_clean(api_client, namespace, name)


async def test_a_planted_pod_elsewhere_does_not_hold_the_modules_deletion(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "victim"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:1]
    core = client.CoreV1Api(api_client)
    async with (
        support.own_namespace(api_client, "tenant") as tenant,
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await support.create_module(
            api_client, namespace, support.module_body(name, {select: "yes"})
        )
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, set(chosen)), "victim loaded"
        )
        planted_labels = _victim_labels(namespace, name, "module-loader")
        await core.create_namespaced_pod(
            tenant, _pod("stuck", planted_labels, nodeSelector=_NOWHERE)
        )
        await _seen_and_reconciled(running, f"{tenant}/stuck", "the planted loader pod")
        await support.delete_and_wait_clean(api_client, namespace, name)
        planted = await core.read_namespaced_pod("stuck", tenant)
        assert planted.metadata.deletion_timestamp is None


@contextlib.asynccontextmanager
async def _tainted(api: client.ApiClient, node: str, taint: Obj) -> AsyncIterator[None]:
    """``node`` with ``taint`` for the block, its taints restored afterwards."""
    core = client.CoreV1Api(api)
    before = (await core.read_node(node)).spec.taints
    try:
        await core.patch_node(node, {"spec": {"taints": [taint]}})
        yield
    finally:
        await core.patch_node(node, {"spec": {"taints": before}})


async def test_a_ready_planted_pod_elsewhere_does_not_make_a_node_look_loaded(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """The victim selects one node whose taint it does not tolerate: its
    loader never runs there. A tenant's Ready pod on that node, labelled as
    the victim's loader pod for that node's kernel and image, must not make
    the operator mark the module loaded there."""
    name = "victim"
    select = f"kmm-test/{namespace}"
    node = sandbox.node_names[0]
    kernel = kernels.node_kernel(sandbox.kernels[0])
    image = "example.com/literal/kmm-test:6.8.0"  # support.module_body's for 6.8.0-45-generic
    assert kernel == "6.8.0-45-generic"
    core = client.CoreV1Api(api_client)
    taint = {"key": "kmm-tenancy", "value": "x", "effect": "NoSchedule"}
    async with (
        support.own_namespace(api_client, "tenant") as tenant,
        support.selecting(api_client, [node], select),
        _tainted(api_client, node, taint),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        planted_labels = _victim_labels(
            namespace,
            name,
            "module-loader",
            **{
                labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel),
                labels.IMAGE_HASH: labels.image_hash(image),
            },
        )
        everything = [{"operator": "Exists"}]
        await core.create_namespaced_pod(
            tenant, _pod("loaded", planted_labels, nodeName=node, tolerations=everything)
        )

        async def planted_ready() -> bool:
            found = await core.read_namespaced_pod("loaded", tenant)
            conditions = found.status.conditions or ()
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        await testing.eventually(planted_ready, "the planted pod Ready (KWOK)")
        await support.create_module(
            api_client, namespace, support.module_body(name, {select: "yes"})
        )

        async def reconciled() -> bool:
            found = await support.get_module(api_client, namespace, name)
            return ((found or {}).get("status") or {}).get("observedGeneration") == 1

        await testing.eventually(reconciled, "the victim reconciled")
        await _seen_and_reconciled(running, f"{tenant}/loaded", "the planted Ready pod")
        found = await support.get_module(api_client, namespace, name)
        assert labels.ready(namespace, name) not in (await support.node_labels(api_client))[node]
        assert (found or {})["status"]["moduleLoader"]["availableNumber"] == 0
        await support.delete_and_wait_clean(api_client, namespace, name)
