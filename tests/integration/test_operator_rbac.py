"""The RBAC in deploy/ is enough: the operator, impersonating its ServiceAccount,
runs leader-elected and converges a Module with a device plugin, then cleans up.

Covers the device-plugin path on the real DaemonSet controller too: its
DaemonSet selects the ``.ready`` label, and ``.device-plugin-ready`` follows
its pods.
"""

from __future__ import annotations

import dataclasses

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs
from kmm.operator import wiring
from kmm.sandbox import testing

manifests = support.manifests

SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"


async def test_operator_with_deployed_rbac_converges_module_and_device_plugin(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    await applying.apply_documents(kmm_api, docs)
    # The Deployment is valid for the API server (schema, defaults), not run here:
    # the sandbox has no image for it.
    deployment = applying.load_documents((support.DEPLOY / "operator/deployment.yaml").read_text())
    assert await applying.apply_documents(kmm_api, deployment, dry_run=True) == [
        "deployment/kmm-operator created (dry run)"
    ]
    # The impersonation bites: the ServiceAccount may not read Secrets.
    access = dataclasses.replace(kubeconfigs.load(sandbox.kubeconfig), impersonate=SERVICE_ACCOUNT)
    async with kube_client.Client(access) as limited:
        with pytest.raises(kube_errors.Forbidden):
            await limited.request("GET", "/api/v1/secrets")

    name = "rbac"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    body = support.module_body(
        name, {select: "yes"}, devicePlugin={"container": {"image": "example.com/plugin:1"}}
    )
    election = wiring.Election(identity=f"rbac-{namespace}", namespace="kmm-system")
    objects = client.CustomObjectsApi(api_client)
    ready_key = labels.ready(namespace, name)
    plugin_key = labels.device_plugin_ready(namespace, name)

    async def converged() -> bool:
        module = await support.get_module(api_client, namespace, name)
        ready = support.condition(module, "Ready")
        plugin = ((module or {}).get("status") or {}).get("devicePlugin") or {}
        nodes = await support.node_labels(api_client)
        return (
            ready is not None
            and ready["status"] == "True"
            and plugin.get("availableNumber") == len(chosen)
            and {n for n, lbl in nodes.items() if ready_key in lbl} == set(chosen)
            and {n for n, lbl in nodes.items() if plugin_key in lbl} == set(chosen)
        )

    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(
            sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT, election=election
        ) as running,
    ):
        await objects.create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
        )
        await testing.eventually(converged, "module and device plugin ready on 2 nodes")
        plugin_sets = await client.AppsV1Api(api_client).list_namespaced_daemon_set(
            namespace, label_selector=f"{labels.ROLE}=device-plugin"
        )
        assert len(plugin_sets.items) == 1
        assert plugin_sets.items[0].spec.template.spec.node_selector == {ready_key: ""}
        events = await client.CoreV1Api(api_client).list_namespaced_event(namespace)
        reasons = [e.reason for e in events.items if e.involved_object.name == name]
        assert reasons.count("DaemonSetCreated") == 3  # two kernels + the device plugin
        assert running.op.leading()

        await objects.delete_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )

        async def clean() -> bool:
            nodes = await support.node_labels(api_client)
            sets = await client.AppsV1Api(api_client).list_namespaced_daemon_set(namespace)
            return (
                await support.get_module(api_client, namespace, name) is None
                and not sets.items
                and not any(ready_key in lbl or plugin_key in lbl for lbl in nodes.values())
            )

        await testing.eventually(clean, "everything removed")
