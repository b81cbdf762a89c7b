"""Pod Security admission on the sandbox (the API server's PodSecurity plugin,
on by default): the operator's pods pass ``restricted``; the pods the operator
makes for a Module are the only privileged ones, and even ``baseline`` refuses
them, so a Module's namespace must allow privileged pods.

PodSecurity enforces on Pods, not on the Deployments or DaemonSets that make
them: the checks create Pods from the templates (dry run), and the operator's
Deployment for real, counting the Pods its ReplicaSet was allowed to create.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import test_operator_support as support

from kmm.api import examples, installation, kernels, validation
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.dra import builders as dra_builders
from kmm.operator.loader import builders as loader_builders
from kmm.sandbox import cluster, testing

DEPLOYMENTS = resources.Resource("apps", "v1", "deployments")
_APP_SELECTOR = "app.kubernetes.io/name=kmm-operator"


def _pod_of(workload: dict[str, Any], namespace: str) -> dict[str, Any]:
    template = copy.deepcopy(workload["spec"]["template"])
    # The namespace's default account: a pod naming an absent one is refused
    # by the ServiceAccount plugin before PodSecurity is asked.
    template["spec"].pop("serviceAccountName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pss-{uuid.uuid4().hex[:8]}",
            "namespace": namespace,
            "labels": template["metadata"].get("labels", {}),
        },
        "spec": template["spec"],
    }


async def _refusal(api: kube_client.Client, workload: dict[str, Any], namespace: str) -> str | None:
    """The API server's message refusing a dry-run Pod of ``workload``, or None."""
    try:
        await api.request(
            "POST",
            resources.PODS.path(namespace=namespace),
            body=_pod_of(workload, namespace),
            query={"dryRun": "All"},
        )
    except kube_errors.Forbidden as err:
        return str(err)
    return None


@contextlib.asynccontextmanager
async def _namespace_at(api: kube_client.Client, level: str) -> AsyncIterator[str]:
    name = f"pss-{level}-{uuid.uuid4().hex[:6]}"
    body = {
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
    }
    await api.request("POST", resources.NAMESPACES.path(), body=body)
    try:
        await cluster.wait_default_account(api, name, timeout=90)
        yield name
    finally:
        await api.request("DELETE", resources.NAMESPACES.path(name=name))


def _module_workloads() -> dict[str, dict[str, Any]]:
    """Every kind of pod the operator makes for a Module, as its DaemonSet."""
    loader = validation.parse_module(examples.module(namespace="pss"))  # with firmware
    target = kernels.target(loader, "6.8.0-45-generic")
    assert target is not None
    plugin_raw = examples.module(namespace="pss")
    plugin_raw["spec"].pop("dra", None)
    # With init containers: they run privileged too (KMM's), judged here as well.
    plugin_raw["spec"]["devicePlugin"] = {
        "container": {"image": "example.com/plugin:1"},
        "initContainer": {"image": "example.com/plugin-init:1"},
    }
    dra_raw = examples.dra_module(namespace="pss")
    dra_raw["spec"]["dra"]["initContainer"] = {"image": "example.com/driver-init:1"}
    return {
        "module-loader": loader_builders.daemonset(loader, target),
        "device-plugin": deviceplugin_builders.daemonset(validation.parse_module(plugin_raw)),
        "dra": dra_builders.daemonset(validation.parse_module(dra_raw)),
    }


async def test_the_operator_passes_restricted_and_module_pods_need_privileged(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    # deploy/'s namespace enforces restricted itself.
    docs = applying.load_documents((support.DEPLOY / "operator/namespace.yaml").read_text())
    await applying.apply_documents(kmm_api, docs)
    namespace = installation.NAMESPACE
    found = await kmm_api.request("GET", resources.NAMESPACES.path(name=namespace))
    assert found["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    operator = installation.deployment()
    assert await _refusal(kmm_api, operator, namespace) is None
    # The control: the admission bites in this namespace. Every pod kind the
    # operator makes for a Module is refused here, and in baseline too.
    workloads = _module_workloads()
    for role, workload in workloads.items():
        refused = await _refusal(kmm_api, workload, namespace)
        assert refused is not None, role
        assert 'violates PodSecurity "restricted:latest"' in refused, role
    async with _namespace_at(kmm_api, "baseline") as baseline:
        for role, workload in workloads.items():
            refused = await _refusal(kmm_api, workload, baseline)
            assert refused is not None, role
            assert 'violates PodSecurity "baseline:latest"' in refused, role
    async with _namespace_at(kmm_api, "privileged") as privileged:
        for role, workload in workloads.items():
            assert await _refusal(kmm_api, workload, privileged) is None, role

    # The Deployment for real: its ReplicaSet's pods are admitted (KWOK runs
    # them; no image is pulled), both replicas.
    await applying.apply_documents(kmm_api, [operator])
    try:

        async def both_created() -> bool:
            listing = await kmm_api.request(
                "GET",
                resources.PODS.path(namespace=namespace),
                query={"labelSelector": _APP_SELECTOR},
            )
            return len(listing["items"]) == 2

        await testing.eventually(both_created, "both operator pods admitted and created")
        replicas = await kmm_api.request(
            "GET",
            resources.Resource("apps", "v1", "replicasets").path(namespace=namespace),
            query={"labelSelector": _APP_SELECTOR},
        )
        for replica_set in replicas["items"]:
            conditions = (replica_set.get("status") or {}).get("conditions") or ()
            assert not [c for c in conditions if c.get("type") == "ReplicaFailure"]
    finally:
        await kmm_api.request("DELETE", DEPLOYMENTS.path(namespace=namespace, name="kmm-operator"))

    async def gone() -> bool:
        listing = await kmm_api.request(
            "GET", resources.PODS.path(namespace=namespace), query={"labelSelector": _APP_SELECTOR}
        )
        return not listing["items"]

    await testing.eventually(gone, "operator pods deleted with their Deployment")
