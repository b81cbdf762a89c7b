"""The sandbox runs the real control plane: the DaemonSet controller, the
scheduler, the garbage collector and CRD validation behave as in Kubernetes.

Each test waits for convergence with a bounded poll: the bound only turns a
hang into a failure, it asserts nothing about speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from kmm.sandbox import testing


def _daemonset(name: str, *, node_selector: dict[str, str] | None = None) -> client.V1DaemonSet:
    labels = {"app": name}
    return client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector=node_selector,
                    containers=[client.V1Container(name="main", image="example.com/pause:3.10")],
                ),
            ),
        ),
    )


async def _running_pods_by_node(core: client.CoreV1Api, namespace: str, app: str) -> dict[str, str]:
    pods = await core.list_namespaced_pod(namespace, label_selector=f"app={app}")
    return {
        pod.spec.node_name: pod.status.phase
        for pod in pods.items
        if pod.spec.node_name and pod.status.phase == "Running"
    }


@contextlib.asynccontextmanager
async def _patched_nodes(
    core: client.CoreV1Api,
    patches: dict[str, dict[str, object]],
    restores: dict[str, dict[str, object]],
) -> AsyncIterator[None]:
    for name, patch in patches.items():
        await core.patch_node(name, patch)
    try:
        yield
    finally:
        for name, patch in restores.items():
            await core.patch_node(name, patch)


async def test_daemonset_pods_run_on_eligible_nodes_only(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    tainted, labelled_a, labelled_b = (
        sandbox.node_names[0],
        sandbox.node_names[1],
        sandbox.node_names[2],
    )
    label = f"test.kmm.io/{namespace}"
    taint = {"key": label, "value": "no", "effect": "NoSchedule"}
    async with _patched_nodes(
        core,
        patches={
            tainted: {"spec": {"taints": [taint]}},
            labelled_a: {"metadata": {"labels": {label: "yes"}}},
            labelled_b: {"metadata": {"labels": {label: "yes"}}},
        },
        restores={
            tainted: {"spec": {"taints": None}},
            labelled_a: {"metadata": {"labels": {label: None}}},
            labelled_b: {"metadata": {"labels": {label: None}}},
        },
    ):
        await apps.create_namespaced_daemon_set(namespace, _daemonset("everywhere"))
        await apps.create_namespaced_daemon_set(
            namespace, _daemonset("selected", node_selector={label: "yes"})
        )
        untainted = set(sandbox.node_names) - {tainted}

        async def everywhere_converged() -> bool:
            return set(await _running_pods_by_node(core, namespace, "everywhere")) == untainted

        async def selected_converged() -> bool:
            return set(await _running_pods_by_node(core, namespace, "selected")) == {
                labelled_a,
                labelled_b,
            }

        await testing.eventually(everywhere_converged, "a pod Running on every untainted node")
        await testing.eventually(selected_converged, "pods Running on exactly the labelled nodes")
        # Settled state, read once more: the tainted node never got a pod.
        everywhere = await core.list_namespaced_pod(namespace, label_selector="app=everywhere")
        assert tainted not in {pod.spec.node_name for pod in everywhere.items}
        status = (await apps.read_namespaced_daemon_set_status("everywhere", namespace)).status
        assert status.desired_number_scheduled == len(untainted)


async def test_deleting_an_owner_deletes_its_dependents(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    owner = await core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    reference = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    for index in range(3):
        await core.create_namespaced_config_map(
            namespace,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(
                    name=f"dependent-{index}", owner_references=[reference]
                )
            ),
        )
    bystander = await core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bystander"))
    )
    await core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    async def dependents_gone() -> bool:
        names = {
            cm.metadata.name for cm in (await core.list_namespaced_config_map(namespace)).items
        }
        return not any(name.startswith("dependent-") for name in names)

    await testing.eventually(dependents_gone, "the garbage collector deletes every dependent")
    still_there = await core.read_namespaced_config_map("bystander", namespace)
    assert still_there.metadata.uid == bystander.metadata.uid


async def test_a_crd_cel_rule_rejects_an_invalid_object_with_its_message(
    api_client: client.ApiClient, namespace: str
) -> None:
    extensions = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    group = f"{namespace}.test.kmm.io"
    crd_name = f"widgets.{group}"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["minReplicas", "maxReplicas"],
                "properties": {
                    "minReplicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "self.minReplicas <= self.maxReplicas",
                        "message": "minReplicas must not exceed maxReplicas",
                    }
                ],
            }
        },
    }
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
    await extensions.create_custom_resource_definition(crd)
    try:

        async def established() -> bool:
            current = await extensions.read_custom_resource_definition(crd_name)
            conditions = current.status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        await testing.eventually(established, "the CRD is Established")

        def widget(name: str, low: int, high: int) -> dict[str, object]:
            return {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": {"minReplicas": low, "maxReplicas": high},
            }

        async def create(body: dict[str, object]) -> None:
            await custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", body)

        # The CRD may be Established a moment before its validators are
        # installed on every handler; a valid create proves the path is live.
        async def accepts_valid() -> bool:
            try:
                await create(widget("good", 1, 3))
            except client.ApiException as err:
                if err.status == 404:
                    return False
                raise
            return True

        await testing.eventually(accepts_valid, "the CRD serves its resource")
        with pytest.raises(client.ApiException) as caught:
            await create(widget("bad", 5, 2))
        assert caught.value.status == 422
        assert "minReplicas must not exceed maxReplicas" in caught.value.body
        listing = await custom.list_namespaced_custom_object(group, "v1", namespace, "widgets")
        assert [item["metadata"]["name"] for item in listing["items"]] == ["good"]
    finally:
        await extensions.delete_custom_resource_definition(crd_name)


async def test_resource_v1_is_served_and_the_scheduler_allocates_claims(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    resource = client.ResourceV1Api(api_client)
    core = client.CoreV1Api(api_client)
    driver = f"{namespace}.test.kmm.io"
    node = sandbox.node_names[-1]
    device_class = f"{namespace}-devices"
    await resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )
    slice_name = f"{namespace}-{node}"
    await resource.create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "dev-0", "attributes": {"model": {"string": "sandbox"}}},
                ],
            },
        }
    )
    try:
        await resource.create_namespaced_resource_claim(
            namespace,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "claim"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "one", "exactly": {"deviceClassName": device_class}}]
                    }
                },
            },
        )
        await core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "consumer"},
                "spec": {
                    "resourceClaims": [{"name": "device", "resourceClaimName": "claim"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.com/pause:3.10",
                            "resources": {"claims": [{"name": "device"}]},
                        }
                    ],
                },
            },
        )

        async def allocated() -> bool:
            claim = await resource.read_namespaced_resource_claim("claim", namespace)
            return bool(claim.status and claim.status.allocation)

        await testing.eventually(allocated, "the scheduler allocates the claim")
        claim = await resource.read_namespaced_resource_claim("claim", namespace)
        results = claim.status.allocation.devices.results
        assert [(r.driver, r.pool, r.device) for r in results] == [(driver, node, "dev-0")]
        assert [ref.name for ref in claim.status.reserved_for] == ["consumer"]
        pod = await core.read_namespaced_pod("consumer", namespace)
        assert pod.spec.node_name == node
    finally:
        await resource.delete_resource_slice(slice_name)
        await resource.delete_device_class(device_class)
