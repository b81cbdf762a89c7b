"""Module fields the operator carries into its device-plugin and DRA pod
specs, read back from the API server's DaemonSets (what the DaemonSet
controller will stamp on every pod): KMM's ``automountServiceAccountToken``
and the privileged init container KMM's init images are written for.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels
from kmm.sandbox import testing

manifests = support.manifests

_PLUGIN = {
    "container": {"image": "example.com/plugin:1"},
    "initContainer": {"image": "example.com/plugin-init:1"},
    "automountServiceAccountToken": False,
}


def _dra(namespace: str) -> dict[str, Any]:
    # No deviceClasses: nothing cluster-scoped outlives the test.
    return {
        "driverName": f"{namespace}.fields.kmm.io",
        "container": {"image": "example.com/driver:1"},
        "initContainer": {"image": "example.com/driver-init:1"},
        "automountServiceAccountToken": False,
    }


async def _daemonset(api: client.ApiClient, namespace: str, role: str) -> Any:
    found: list[Any] = []

    async def created() -> bool:
        listing = await client.AppsV1Api(api).list_namespaced_daemon_set(
            namespace, label_selector=f"{labels.ROLE}={role}"
        )
        found[:] = listing.items
        return len(found) == 1

    await testing.eventually(created, f"the {role} DaemonSet")
    return found[0]


@pytest.mark.parametrize("role", ["device-plugin", "dra"])
async def test_automount_false_and_a_privileged_init_container_reach_the_daemonset(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    role: str,
) -> None:
    name = f"fields-{role}"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:1]
    spec = {"devicePlugin": _PLUGIN} if role == "device-plugin" else {"dra": _dra(namespace)}
    body = support.module_body(name, {select: "yes"}, **spec)
    del body["spec"]["moduleLoader"]  # an in-tree driver: the DaemonSet comes at once
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig),
    ):
        await support.create_module(api_client, namespace, body)
        pod = (await _daemonset(api_client, namespace, role)).spec.template.spec
        assert pod.automount_service_account_token is False
        [init] = pod.init_containers
        assert init.security_context.privileged is True
        await support.delete_and_wait_clean(api_client, namespace, name)

        async def gone() -> bool:
            listing = await client.AppsV1Api(api_client).list_namespaced_daemon_set(
                namespace, label_selector=f"{labels.ROLE}={role}"
            )
            target = labels.dra_target(namespace, name)
            nodes = await support.node_labels(api_client)
            return not listing.items and not any(target in lbl for lbl in nodes.values())

        await testing.eventually(gone, f"the {role} DaemonSet and DRA target labels gone")
