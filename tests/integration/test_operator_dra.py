"""The DRA reconciler on the sandbox (seed 000 "DRA", one test per point).

The real DaemonSet controller places (and evicts) the driver pods from the
labels the operator writes, the real scheduler allocates claims against a
ResourceSlice the test publishes, and the real resourceclaim controller
clears a claim's reservation when its pod goes: nothing here is mocked.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import test_operator_support as support
import test_operator_upgrades as upgrades
from kubernetes_asyncio import client

from kmm.api import conditions, labels, modules
from kmm.sandbox import cluster, testing

manifests = support.manifests

MERGE = "application/merge-patch+json"
SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"


def driver_of(namespace: str) -> str:
    return f"{namespace}.dra.kmm.io"


def dra_spec(namespace: str, **extra: Any) -> dict[str, Any]:
    driver = driver_of(namespace)
    return {
        "driverName": driver,
        "container": {"image": "example.com/driver:1", "env": [{"name": "LOG", "value": "4"}]},
        "deviceClasses": [
            {"name": f"{namespace}-any"},  # selects the driver by default
            {
                "name": f"{namespace}-sandbox",
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{driver}"].model == "sandbox"'}}
                ],
            },
        ],
        **extra,
    }


def dra_body(name: str, select: str, namespace: str, *, loader: bool = True) -> dict[str, Any]:
    body = support.module_body(name, {select: "yes"}, dra=dra_spec(namespace))
    if not loader:
        del body["spec"]["moduleLoader"]
    return body


create = support.create_module


async def patch_spec(
    api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]
) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name, {"spec": spec},
        _content_type=MERGE,
    )  # fmt: skip


async def dra_daemonsets(api: client.ApiClient, namespace: str) -> list[Any]:
    listing = await client.AppsV1Api(api).list_namespaced_daemon_set(
        namespace, label_selector=f"{labels.ROLE}=dra"
    )
    return list(listing.items)


async def driver_nodes(api: client.ApiClient, namespace: str) -> set[str]:
    """Nodes where a DRA driver pod of the namespace's Module is Ready (not terminating)."""
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{labels.ROLE}=dra"
    )
    return {
        p.spec.node_name
        for p in pods.items
        if p.spec.node_name
        and not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
    }


async def labelled(api: client.ApiClient, key: str) -> set[str]:
    return {n for n, found in (await support.node_labels(api)).items() if key in found}


async def our_classes(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    listing = await client.ResourceV1Api(api).list_device_class(
        label_selector=f"{labels.MODULE_NAMESPACE}={namespace},{labels.MODULE_NAME}={name}"
    )
    return list(listing.items)


@contextlib.asynccontextmanager
async def node_spec(api: client.ApiClient, node: str, spec: dict[str, Any]) -> AsyncIterator[None]:
    """Patch a node's spec for the block; restore cordon and taints afterwards."""
    core = client.CoreV1Api(api)
    try:
        await core.patch_node(node, {"spec": spec})
        yield
    finally:
        await core.patch_node(node, {"spec": {"unschedulable": None, "taints": None}})


async def wait_targets(
    api: client.ApiClient, namespace: str, name: str, nodes: set[str], what: str
) -> None:
    target = labels.dra_target(namespace, name)

    async def there() -> bool:
        return (
            await labelled(api, target) == nodes
            and await driver_nodes(api, namespace) == nodes
            and await labelled(api, labels.dra_ready(namespace, name)) == nodes
        )

    await testing.eventually(there, what, bound=120)


async def test_cordon_and_untolerated_taints_take_the_driver_off_a_node(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name, select = "cordon", f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    moved = chosen[0]
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await create(api_client, namespace, dra_body(name, select, namespace))
        await wait_targets(api_client, namespace, name, set(chosen), "drivers on both nodes")

        async with node_spec(api_client, moved, {"unschedulable": True}):
            await wait_targets(
                api_client, namespace, name, {chosen[1]}, "driver off the cordoned node"
            )
            # The module stays loaded: cordoning must not unload what is in use.
            assert moved in await labelled(api_client, labels.ready(namespace, name))
        await wait_targets(api_client, namespace, name, set(chosen), "back after uncordon")

        tolerated = {"key": "kmm-test", "value": "x", "effect": "NoSchedule"}
        async with node_spec(api_client, moved, {"taints": [tolerated]}):
            await running.wait_idle("tolerated taint seen")
            assert await labelled(api_client, labels.dra_target(namespace, name)) == set(chosen)
            assert await driver_nodes(api_client, namespace) == set(chosen)

        evicting = {"key": "kmm-test-evict", "value": "x", "effect": "NoExecute"}
        async with node_spec(api_client, moved, {"taints": [evicting]}):
            await wait_targets(
                api_client, namespace, name, {chosen[1]}, "NoExecute acts as a cordon"
            )
        await wait_targets(api_client, namespace, name, set(chosen), "back after the taint")
        await support.delete_and_wait_clean(api_client, namespace, name)


async def _publish(api: client.ApiClient, namespace: str, node: str) -> str:
    name = f"{namespace}-{node}"
    await client.ResourceV1Api(api).create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver_of(namespace),
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev-0", "attributes": {"model": {"string": "sandbox"}}}],
            },
        }
    )
    return name


async def _claim_and_pod(api: client.ApiClient, namespace: str, device_class: str) -> None:
    await client.ResourceV1Api(api).create_namespaced_resource_claim(
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
    await client.CoreV1Api(api).create_namespaced_pod(
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


async def test_device_classes_are_made_and_a_claim_in_use_holds_a_cordoned_node(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name, select = "claims", f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    node = chosen[0]
    target = labels.dra_target(namespace, name)
    resource = client.ResourceV1Api(api_client)
    slice_name = await _publish(api_client, namespace, node)
    try:
        async with support.selecting(api_client, chosen, select):
            async with support.operator_in_process(sandbox.kubeconfig) as running:
                await create(api_client, namespace, dra_body(name, select, namespace))
                await wait_targets(api_client, namespace, name, set(chosen), "drivers on both")

                async def made() -> bool:
                    return len(await our_classes(api_client, namespace, name)) == 2

                await testing.eventually(made, "both DeviceClasses made")
                default = await resource.read_device_class(f"{namespace}-any")
                assert default.spec.selectors[0].cel.expression == (
                    f'device.driver == "{driver_of(namespace)}"'
                )

                async def counted() -> bool:
                    module = await support.get_module(api_client, namespace, name)
                    ready = support.condition(module, "Ready") or {}
                    dra = ((module or {}).get("status") or {}).get("dra") or {}
                    return (
                        dra.get("availableNumber") == 2
                        and ready.get("status") == "True"
                        and "2/2 DRA drivers ready" in ready.get("message", "")
                    )

                await testing.eventually(counted, "status.dra counts and Ready say 2/2")

                # Converged: a resync writes nothing.
                await running.wait_idle("converged")
                running.counter.reset()
                running.op.resync()
                await running.wait_idle("resync")
                assert dict(running.counter.writes) == {}

            # A restart reconciles from fresh caches and still writes nothing.
            async with support.operator_in_process(sandbox.kubeconfig) as restarted:
                await restarted.wait_idle("restart reconciled")
                assert dict(restarted.counter.writes) == {}

                # The class with a CEL selector on an attribute allocates a real claim.
                await _claim_and_pod(api_client, namespace, f"{namespace}-sandbox")

                async def allocated() -> bool:
                    claim = await resource.read_namespaced_resource_claim("claim", namespace)
                    return bool(claim.status and claim.status.reserved_for)

                await testing.eventually(allocated, "the scheduler allocates and reserves")
                pod = await client.CoreV1Api(api_client).read_namespaced_pod("consumer", namespace)
                assert pod.spec.node_name == node

                async with node_spec(api_client, node, {"unschedulable": True}):
                    await restarted.wait_idle("cordon seen")
                    assert node in await labelled(api_client, target)  # the claim holds it
                    assert node in await driver_nodes(api_client, namespace)
                    await client.CoreV1Api(api_client).delete_namespaced_pod(
                        "consumer", namespace, grace_period_seconds=0
                    )

                    async def released() -> bool:
                        return node not in await labelled(api_client, target)

                    await testing.eventually(released, "label gone once the claim is free")
                    await testing.eventually(
                        lambda: _without(api_client, namespace, node), "driver gone from the node"
                    )
                await support.delete_and_wait_clean(api_client, namespace, name)
    finally:
        await resource.delete_resource_slice(slice_name)


async def _without(api: client.ApiClient, namespace: str, node: str) -> bool:
    return node not in await driver_nodes(api, namespace)


async def test_leaving_the_selector_keeps_the_label_until_dra_is_removed(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name, select = "leave", f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    leaving = chosen[0]
    target = labels.dra_target(namespace, name)
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await create(api_client, namespace, dra_body(name, select, namespace))
        await wait_targets(api_client, namespace, name, set(chosen), "drivers on both")
        await client.CoreV1Api(api_client).patch_node(
            leaving, {"metadata": {"labels": {select: None}}}
        )

        async def unloaded() -> bool:
            return leaving not in await labelled(api_client, labels.ready(namespace, name))

        await testing.eventually(unloaded, "unloaded from the node that left")
        await running.wait_idle("settled")
        assert await labelled(api_client, target) == set(chosen)  # not visited

        await patch_spec(api_client, namespace, name, {"dra": None})

        async def dra_gone() -> bool:
            return (
                not await labelled(api_client, target)
                and not await labelled(api_client, labels.dra_ready(namespace, name))
                and not await dra_daemonsets(api_client, namespace)
                and not await our_classes(api_client, namespace, name)
            )

        await testing.eventually(dra_gone, "DaemonSet, DeviceClasses and labels gone")
        # The module itself stays loaded where it is selected.
        assert await labelled(api_client, labels.ready(namespace, name)) == {chosen[1]}
        await support.delete_and_wait_clean(api_client, namespace, name)


async def test_deleting_the_module_leaves_nothing_anywhere_with_the_deployed_rbac(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    from kmm.cli import applying

    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    async with cluster.api_client(sandbox.kubeconfig) as admin:
        await applying.apply_documents(admin, docs)
    name, select = "gone", f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT),
    ):
        await create(api_client, namespace, dra_body(name, select, namespace))
        await wait_targets(api_client, namespace, name, set(chosen), "drivers on both")
        assert len(await our_classes(api_client, namespace, name)) == 2
        await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )

        async def nothing_left() -> bool:
            pods = await client.CoreV1Api(api_client).list_namespaced_pod(namespace)
            sets = await client.AppsV1Api(api_client).list_namespaced_daemon_set(namespace)
            nodes = await support.node_labels(api_client)
            mine = [
                k
                for found in nodes.values()
                for k in found
                if labels.module_of_node_label(k) == (namespace, name)
            ]
            return (
                await support.get_module(api_client, namespace, name) is None
                and not pods.items
                and not sets.items
                and not mine
                and not await our_classes(api_client, namespace, name)
            )

        await testing.eventually(
            nothing_left, "nothing of the Module in any namespace or cluster-wide"
        )


async def test_adding_a_module_loader_converges_to_one_dra_daemonset(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name, select = "intree", f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        body = dra_body(name, select, namespace, loader=False)
        await create(api_client, namespace, body)

        async def running_in_tree() -> bool:
            return await driver_nodes(api_client, namespace) == set(chosen)

        await testing.eventually(running_in_tree, "in-tree drivers on both")
        (first,) = await dra_daemonsets(api_client, namespace)
        # The selector and the DRA target: a cordoned node loses the target.
        assert first.spec.template.spec.node_selector == {
            select: "yes",
            labels.dra_target(namespace, name): "",
        }

        await patch_spec(
            api_client,
            namespace,
            name,
            {"moduleLoader": support.module_body(name, {})["spec"]["moduleLoader"]},
        )
        wanted = {labels.ready(namespace, name): "", labels.dra_target(namespace, name): ""}

        async def one_on_the_labels() -> bool:
            found = await dra_daemonsets(api_client, namespace)
            return len(found) == 1 and found[0].spec.template.spec.node_selector == wanted

        await testing.eventually(one_on_the_labels, "one DRA DaemonSet on .ready + .dra-target")
        await wait_targets(api_client, namespace, name, set(chosen), "drivers back where loaded")
        await running.wait_idle("settled")
        (second,) = await dra_daemonsets(api_client, namespace)
        assert second.metadata.uid == first.metadata.uid
        await support.delete_and_wait_clean(api_client, namespace, name)


async def test_a_cluster_without_the_resource_api_degrades_dra_modules_only(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from kmm.cli import paths

    directory = tmp_path_factory.mktemp("nodra")
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=1,
        runtime_config=("resource.k8s.io/v1=false",),
    )
    record = await cluster.up(options)
    try:
        await support.install_manifests(record.kubeconfig)
        api = await support.independent_client(record.kubeconfig)
        async with api, support.operator_in_process(record.kubeconfig) as running:
            await client.CoreV1Api(api).patch_node(
                record.node_names[0], {"metadata": {"labels": {"kmm-test/nodra": "yes"}}}
            )
            await create(api, "default", dra_body("nodra", "kmm-test/nodra", "default"))

            async def degraded() -> bool:
                module = await support.get_module(api, "default", "nodra")
                found = support.condition(module, "Degraded")
                return (
                    found is not None
                    and found["reason"] == conditions.REASON_RESOURCE_API_UNAVAILABLE
                )

            await testing.eventually(degraded, "Degraded: ResourceAPIUnavailable")
            await running.wait_idle("settled")
            assert "resourceclaims" not in running.op.cached()
            loaders = await support.loader_daemonsets(api, "default")
            assert loaders  # the rest of the Module proceeds
            running.counter.reset()
            running.op.resync()
            await running.wait_idle("resync")
            assert dict(running.counter.writes) == {}  # no retry loop
    finally:
        cluster.down(directory)


async def test_an_ordered_upgrade_moves_the_dra_driver_in_the_safe_order(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    chosen = sandbox.node_names[:2]
    k = upgrades.keys(namespace)
    spec = dra_spec(namespace)
    async with (
        support.operator_in_process(sandbox.kubeconfig) as running,
        cluster.api_client(sandbox.kubeconfig) as kmm_api,
        upgrades.module_on(api_client, namespace, chosen, "v1", spec) as select,
    ):
        assert await driver_nodes(api_client, namespace) == set(chosen)
        await upgrades.set_module_version(api_client, namespace, select, "v2", spec)
        async with upgrades.Recorder(kmm_api, namespace, chosen).recording() as recorder:
            await upgrades.set_version(api_client, namespace, chosen[0], "v2")
            await upgrades.wait_on(api_client, namespace, chosen[:1], "v2")
            await upgrades.recorded(recorder, node=chosen[0], key=k["done"], value="v2")
            moved = [c for c in recorder.ordered() if c.node == chosen[0]]
            steps = upgrades.safe_order_steps(moved, k, "dra")
            assert steps == sorted(steps), moved
            others = [c for c in recorder.ordered() if c.node == chosen[1]]
            assert not [c for c in others if c.key == k["ready"]], others

            await upgrades.set_version(api_client, namespace, chosen[1], "v2")
            await upgrades.wait_on(api_client, namespace, chosen[1:], "v2")

            async def old_driver_gone() -> bool:
                return [
                    d.metadata.labels.get(labels.MODULE_VERSION)
                    for d in await dra_daemonsets(api_client, namespace)
                ] == ["v2"]

            await testing.eventually(old_driver_gone, "the v1 DRA DaemonSet collected")
            await running.wait_idle("settled")
            changes = recorder.ordered()
        gone = upgrades.first(changes, what="ds-gone", key="dra", value="v1")
        for node in chosen:  # not before both nodes left v1's gate
            assert any(
                c.node == node and c.key == k["plugin"] and c.value is None for c in changes[:gone]
            ), node
        assert await driver_nodes(api_client, namespace) == set(chosen)
        await upgrades.remove(api_client, namespace)
