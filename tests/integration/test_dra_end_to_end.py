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

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import test_kubelet_emulator as emulating
import test_kubelet_nodes as real
import test_operator_dra as dra
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import examples, installation, labels
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
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


def _workload(name: str, node: str, template: str) -> dict[str, Any]:
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


@pytest.mark.usefixtures("manifests")
async def test_a_dra_module_brings_a_workload_its_device_and_leaves_nothing_behind(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    async with (
        emulating.emulated(kmm_api, wipe_delay=2.0) as (node, running),
        driver_rbac(kmm_api, namespace),
        support.operator_in_process(sandbox.kubeconfig) as operator,
    ):
        module = f"e2e{uuid.uuid4().hex[:6]}"
        real.fake_tree(node.root, module)
        select = f"kmm-e2e-{module}"
        body = examples.dra_module("demo", namespace, module_name=module, selector={select: "yes"})
        driver = body["spec"]["dra"]["driverName"]
        device_class = body["spec"]["dra"]["deviceClasses"][0]["name"]
        async with support.selecting(api_client, [node.name], select):
            await dra.create(api_client, namespace, body)

            async def registered() -> bool:
                return running.registry.usable(driver)

            await testing.eventually(
                registered, "the driver pod's kmm driver registered", bound=180
            )

            async def published() -> bool:
                listing = await kmm_api.request(
                    "GET",
                    resources.RESOURCE_SLICES.path(),
                    query={"fieldSelector": f"spec.nodeName={node.name},spec.driver={driver}"},
                )
                return bool(listing["items"])

            await testing.eventually(published, "its devices published")
            await dra.wait_targets(api_client, namespace, "demo", {node.name}, "driver Ready")

            template = f"t-{module}"
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
                                    {"name": "one", "exactly": {"deviceClassName": device_class}}
                                ]
                            }
                        }
                    },
                },
            )
            workload = f"w-{module}"
            await kmm_api.request(
                "POST",
                resources.PODS.path(namespace),
                body=_workload(workload, node.name, template),
            )

            async def workload_running() -> bool:
                try:
                    pod = await kmm_api.request("GET", resources.PODS.path(namespace, workload))
                except kube_errors.NotFound:
                    return False
                return bool((pod.get("status") or {}).get("phase") == "Running")

            await testing.eventually(workload_running, "the workload Running", bound=120)
            pod = await kmm_api.request("GET", resources.PODS.path(namespace, workload))
            (claim,) = emulating._claims(node)
            (device,) = (claim.driver_state or {})[driver]
            assert device.device_name.startswith(module)
            assert emulating._containers(node)[pod["metadata"]["uid"]] == {
                "main": list(device.cdi_device_ids or ())
            }
            specs = sorted(node.cdi_dir.glob(f"{driver}-*.json"))
            assert len(specs) == 1

            # Back down: the workload goes, its claim is unprepared; then the Module.
            await kmm_api.request("DELETE", resources.PODS.path(namespace, workload))

            async def unprepared() -> bool:
                return not emulating._claims(node) and not list(node.cdi_dir.glob(f"{driver}-*"))

            await testing.eventually(unprepared, "the claim unprepared, its CDI spec gone")
            await support.delete_and_wait_clean(api_client, namespace, "demo")
            await operator.wait_idle("the Module gone")

            async def nothing_left() -> bool:
                return (
                    not await dra.dra_daemonsets(api_client, namespace)
                    and not await dra.our_classes(api_client, namespace, "demo")
                    and not await dra.labelled(api_client, labels.dra_target(namespace, "demo"))
                    and not running.registry.usable(driver)
                    and not (node.kubelet_dir / "plugins_registry" / f"{driver}-reg.sock").exists()
                    and not await published()
                )

            await testing.eventually(nothing_left, "no DaemonSet, class, label, socket or slice")
