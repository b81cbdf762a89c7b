"""From a Module to a pod holding a prepared claim, with nothing started by hand
but the operator and the emulated node.

The operator's DRA DaemonSet places a driver pod on the ``kmm kubelet`` node;
the emulator runs its container (kmm's image) as ``kmm driver`` with the
pod's environment, mounts and ServiceAccount (``deploy/examples``' RBAC, no
more); the driver registers, publishes the fake module's devices; the real
controller-manager and scheduler turn a workload's ResourceClaimTemplate into
a claim allocated on the node; the emulator prepares it and the workload runs
with the CDI ids of its device. Then back down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import test_kubelet_emulator as emulating
import test_kubelet_nodes as real
import test_operator_dra as dra
import test_operator_support as support
import test_operator_upgrades as upgrades
from kubernetes_asyncio import client

from kmm.api import examples, installation, labels
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import objects, resources
from kmm.sandbox import testing

manifests = support.manifests


@contextlib.asynccontextmanager
async def driver_rbac(api: kube_client.Client, namespace: str) -> AsyncIterator[None]:
    objects = installation.dra_driver_rbac(namespace)
    await applying.apply_documents(api, objects)
    try:
        yield
    finally:
        for obj in objects[1:]:  # the ServiceAccount goes with the namespace
            kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
            with contextlib.suppress(kube_errors.NotFound):
                await api.request(
                    "DELETE",
                    f"/apis/rbac.authorization.k8s.io/v1/{kind}/{obj['metadata']['name']}",
                )


def _pod_body(name: str, node: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/app:1",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }


@dataclasses.dataclass(frozen=True)
class Deployed:
    module: str  # the fake kernel module's name, unique per test
    driver: str
    device_class: str
    node: emulating.EmulatedNode
    running: Any  # the node's emulator.Emulator


async def _slices(api: kube_client.Client, node: str, driver: str) -> list[dict[str, Any]]:
    listing = await api.request(
        "GET",
        resources.RESOURCE_SLICES.path(),
        query={"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"},
    )
    found: list[dict[str, Any]] = listing["items"]
    return found


@contextlib.asynccontextmanager
async def deployed(
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
    change: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> AsyncIterator[Deployed]:
    """An emulated node selected by a DRA Module of ``examples.dra_module``
    (``change`` may edit it first), its driver pod registered and its devices
    published."""
    async with emulating.emulated(kmm_api, wipe_delay=2.0, **options) as (node, running):
        module = f"e2e{uuid.uuid4().hex[:6]}"
        real.fake_tree(node.root, module)
        select = f"kmm-e2e-{module}"
        body = examples.dra_module("demo", namespace, module_name=module, selector={select: "yes"})
        if change is not None:
            change(body)
        found = Deployed(
            module=module,
            driver=body["spec"]["dra"]["driverName"],
            device_class=body["spec"]["dra"]["deviceClasses"][0]["name"],
            node=node,
            running=running,
        )
        async with support.selecting(api_client, [node.name], select):
            await dra.create(api_client, namespace, body)

            async def registered() -> bool:
                return bool(running.registry.usable(found.driver))

            async def published() -> bool:
                return bool(await _slices(kmm_api, node.name, found.driver))

            await testing.eventually(
                registered, "the driver pod's kmm driver registered", bound=180
            )
            await testing.eventually(published, "its devices published")
            await dra.wait_targets(api_client, namespace, "demo", {node.name}, "driver Ready")
            yield found


async def _workload(kmm_api: kube_client.Client, namespace: str, on: Deployed) -> dict[str, Any]:
    """A pod with a claim from a template for the Module's DeviceClass, Running."""
    template = f"t-{uuid.uuid4().hex[:6]}"
    await kmm_api.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "one", "exactly": {"deviceClassName": on.device_class}}
                        ]
                    }
                }
            },
        },
    )
    name = f"w-{template}"
    await kmm_api.request(
        "POST", resources.PODS.path(namespace), body=_pod_body(name, on.node.name, template)
    )

    async def workload_running() -> bool:
        try:
            pod = await kmm_api.request("GET", resources.PODS.path(namespace, name))
        except kube_errors.NotFound:
            return False
        return bool((pod.get("status") or {}).get("phase") == "Running")

    await testing.eventually(workload_running, "the workload Running", bound=120)
    pod: dict[str, Any] = await kmm_api.request("GET", resources.PODS.path(namespace, name))
    return pod


async def cordoned(api: client.ApiClient, node: str) -> None:
    # Not restored: the emulated node goes with the test.
    await client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": True}})


def _unprepared(on: Deployed) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return not emulating._claims(on.node) and not list(on.node.cdi_dir.glob(f"{on.driver}-*"))

    return check


@pytest.mark.usefixtures("manifests")
async def test_a_dra_module_brings_a_workload_its_device_and_leaves_nothing_behind(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    async with (
        driver_rbac(kmm_api, namespace),
        support.operator_in_process(sandbox.kubeconfig),
        deployed(api_client, kmm_api, namespace) as on,
    ):
        pod = await _workload(kmm_api, namespace, on)
        (claim,) = emulating._claims(on.node)
        (device,) = (claim.driver_state or {})[on.driver]
        assert device.device_name.startswith(on.module)
        assert emulating._containers(on.node)[pod["metadata"]["uid"]] == {
            "main": list(device.cdi_device_ids or ())
        }
        assert len(list(on.node.cdi_dir.glob(f"{on.driver}-*.json"))) == 1

        # Back down: the workload goes, its claim is unprepared; then the Module.
        await kmm_api.request("DELETE", resources.PODS.path(namespace, pod["metadata"]["name"]))
        await testing.eventually(_unprepared(on), "the claim unprepared, its CDI spec gone")
        await support.delete_and_wait_clean(api_client, namespace, "demo")
        socket = on.node.kubelet_dir / "plugins_registry" / f"{on.driver}-reg.sock"

        async def nothing_left() -> bool:
            return (
                not await dra.dra_daemonsets(api_client, namespace)
                and not await dra.our_classes(api_client, namespace, "demo")
                and not await dra.labelled(api_client, labels.dra_target(namespace, "demo"))
                and not on.running.registry.usable(on.driver)
                and not socket.exists()
                and not await _slices(kmm_api, on.node.name, on.driver)
            )

        await testing.eventually(nothing_left, "no DaemonSet, class, label, socket or slice")


@pytest.mark.usefixtures("manifests")
async def test_cordoning_unprepares_the_evicted_workloads_claim_before_the_driver_goes(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    async with (
        driver_rbac(kmm_api, namespace),
        support.operator_in_process(sandbox.kubeconfig),
        deployed(api_client, kmm_api, namespace) as on,
    ):
        pod = await _workload(kmm_api, namespace, on)
        await cordoned(api_client, on.node.name)
        target = labels.dra_target(namespace, "demo")
        ready = labels.dra_ready(namespace, "demo")
        # Cordoned while the claim is in use: the driver stays. The operator
        # sends all of a node's label changes in one patch. Its ready label
        # taken off after the cordon, the node as it caches it shows both:
        # the label put back proves a reconcile saw the cordon, and the patch
        # that put it back would have taken the target off with it.
        await client.CoreV1Api(api_client).patch_node(
            on.node.name, {"metadata": {"labels": {ready: None}}}
        )

        async def patched_again() -> bool:
            found = await upgrades.node_labels(api_client, on.node.name)
            return ready in found or target not in found  # the latter: wrongly

        await testing.eventually(patched_again, "the ready label put back")
        assert target in await upgrades.node_labels(api_client, on.node.name)
        assert on.running.registry.usable(on.driver)

        # Evicted, as a drain does; the claim unprepared through the driver,
        # and only then do the label and the driver pod go.
        await kmm_api.request(
            "POST",
            resources.PODS.path(namespace, pod["metadata"]["name"], subresource="eviction"),
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
            },
        )
        await testing.eventually(_unprepared(on), "the claim unprepared, its CDI spec gone")
        assert on.running.manager.count("NodeUnprepareResources") == 1
        assert (
            on.running.metrics.operations.labels(
                "NodeUnprepareResources", on.driver, "ok"
            )._value.get()
            == 1
        )

        async def driver_gone() -> bool:
            return on.node.name not in await dra.labelled(
                api_client, target
            ) and not await dra.driver_nodes(api_client, namespace)

        await testing.eventually(driver_gone, "the label and the driver pod gone", bound=120)
        assert not list(on.node.cdi_dir.iterdir())
        await support.delete_and_wait_clean(api_client, namespace, "demo")


def _versioned(select: str, version: str, module: str) -> dict[str, Any]:
    """The upgrade tests' versioned Module, its DRA driver ``kmm driver`` (the example's)."""
    found = upgrades.body(select, version, {"driverName": f"{upgrades.NAME}.kmm.io"})
    example = examples.dra_module(upgrades.NAME, module_name=module)["spec"]["dra"]
    found["spec"]["dra"] = {**example, "driverName": f"{upgrades.NAME}.kmm.io"}
    del found["spec"]["imageRepoSecret"]
    return found


def _driver_pods(pods: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if p["spec"].get("nodeName") == node
        and objects.labels(p).get(labels.ROLE) == "dra"
        and not p["metadata"].get("deletionTimestamp")
    ]


@pytest.mark.usefixtures("manifests")
async def test_an_ordered_upgrade_of_a_dra_module_moves_one_node_while_the_other_serves(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    module = f"up{uuid.uuid4().hex[:6]}"
    select = f"kmm-e2e-{module}"
    kernel = {"kernel": "6.8.0-45-generic"}
    async with (
        driver_rbac(kmm_api, namespace),
        support.operator_in_process(sandbox.kubeconfig) as operator,
        emulating.emulated(kmm_api, node_spec=kernel) as (a, on_a),
        emulating.emulated(kmm_api, node_spec=kernel) as (b, on_b),
        support.selecting(api_client, [a.name, b.name], select),
    ):
        for node in (a, b):
            real.fake_tree(node.root, module)
        body = _versioned(select, "v1", module)
        driver = body["spec"]["dra"]["driverName"]
        device_class = body["spec"]["dra"]["deviceClasses"][0]["name"]
        await dra.create(api_client, namespace, body)
        for node in (a, b):
            await upgrades.set_version(api_client, namespace, node.name, "v1")
        await upgrades.wait_on(api_client, namespace, [a.name, b.name], "v1")
        served = {
            node.name: Deployed(module, driver, device_class, node, running)
            for node, running in ((a, on_a), (b, on_b))
        }
        for found in served.values():

            async def registered(found: Deployed = found) -> bool:
                return bool(found.running.registry.usable(driver))

            await testing.eventually(registered, f"v1 registered on {found.node.name}")
        first_a = await _workload(kmm_api, namespace, served[a.name])
        first_b = await _workload(kmm_api, namespace, served[b.name])

        await dra.patch_spec(
            api_client, namespace, upgrades.NAME, _versioned(select, "v2", module)["spec"]
        )
        # As the seed's admin does: the node's workload goes first.
        await kmm_api.request("DELETE", resources.PODS.path(namespace, first_a["metadata"]["name"]))
        await testing.eventually(_unprepared(served[a.name]), "a's claim unprepared by v1")
        b_registered_throughout = True

        async def watch_b() -> None:
            nonlocal b_registered_throughout
            while True:
                b_registered_throughout &= bool(on_b.registry.usable(driver))
                await asyncio.sleep(0.2)

        watching = asyncio.ensure_future(watch_b())
        try:
            await upgrades.set_version(api_client, namespace, a.name, "v2")
            await upgrades.wait_on(api_client, namespace, [a.name], "v2")

            async def v2_serves_a() -> bool:
                pods = (await kmm_api.request("GET", resources.PODS.path(namespace)))["items"]
                versions = [
                    objects.labels(p).get(labels.MODULE_VERSION) for p in _driver_pods(pods, a.name)
                ]
                return versions == ["v2"] and bool(on_a.registry.usable(driver))

            await testing.eventually(v2_serves_a, "v2's driver registered on a", bound=180)
            second_a = await _workload(kmm_api, namespace, served[a.name])
            # b never stopped: its driver registered, its workload running.
            state_b = await kmm_api.request(
                "GET", resources.PODS.path(namespace, first_b["metadata"]["name"])
            )
            assert state_b["status"]["phase"] == "Running"
        finally:
            watching.cancel()
        assert b_registered_throughout
        pods = (await kmm_api.request("GET", resources.PODS.path(namespace)))["items"]
        (v2_pod,) = _driver_pods(pods, a.name)
        meta = v2_pod["metadata"]
        log_dir = a.root / "var/log/pods" / f"{namespace}_{meta['name']}_{meta['uid']}"
        said = "".join(p.read_text() for p in log_dir.rglob("*.log"))
        (claim_status,) = second_a["status"]["resourceClaimStatuses"]
        assert f"claim {namespace}/{claim_status['resourceClaimName']} prepared" in said
        for pod in (second_a, first_b):
            await kmm_api.request("DELETE", resources.PODS.path(namespace, pod["metadata"]["name"]))
        for found in served.values():
            await testing.eventually(_unprepared(found), f"{found.node.name} unprepared")
        await upgrades.remove(api_client, namespace)
        await operator.wait_idle("the Module gone")


def _with_settings(body: dict[str, Any]) -> None:
    """The driver reads --config from a ConfigMap volume, as a user would give it."""
    dra_spec = body["spec"]["dra"]
    dra_spec["volumes"].append({"name": "settings", "configMap": {"name": "driver-settings"}})
    container = dra_spec["container"]
    container["volumeMounts"].append(
        {"name": "settings", "mountPath": "/etc/kmm", "readOnly": True}
    )
    container["args"].append("--config=/etc/kmm/driver.yaml")


@pytest.mark.usefixtures("manifests")
async def test_toggling_dra_enabled_in_the_drivers_configmap_is_refused_and_it_keeps_serving(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    settings = resources.Resource("", "v1", "configmaps")
    await kmm_api.request(
        "POST",
        settings.path(namespace),
        body={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "driver-settings"},
            "data": {"driver.yaml": "dra:\n  enabled: true\n"},
        },
    )
    async with (
        driver_rbac(kmm_api, namespace),
        support.operator_in_process(sandbox.kubeconfig),
        deployed(api_client, kmm_api, namespace, _with_settings, volume_refresh=1.0) as on,
    ):
        await kmm_api.request(
            "PATCH",
            settings.path(namespace, "driver-settings"),
            body={"data": {"driver.yaml": "dra:\n  enabled: false\n"}},
            content_type=kube_client.MERGE_PATCH,
        )

        async def warned() -> bool:
            listing = await kmm_api.request(
                "GET",
                resources.EVENTS.path("default"),
                query={
                    "fieldSelector": f"involvedObject.name={on.node.name},reason=RestartRequired"
                },
            )
            return any("dra.enabled" in e["message"] for e in listing["items"])

        await testing.eventually(warned, "the RestartRequired Event on the Node")
        # Still serving: registered, and a new workload's claim is prepared.
        assert on.running.registry.usable(on.driver)
        pod = await _workload(kmm_api, namespace, on)
        await kmm_api.request("DELETE", resources.PODS.path(namespace, pod["metadata"]["name"]))
        await testing.eventually(_unprepared(on), "unprepared")
        await support.delete_and_wait_clean(api_client, namespace, "demo")
