"""What build, sign and preflight add to the deployed RBAC, checked as the
operator's ServiceAccount (impersonated) on the real API server: pods made and
removed, ConfigMaps and Secrets read by name; no Secret listed or watched, no
pod log; PreflightValidations listed, watched and answered through /status,
and pods they own made with blockOwnerDeletion."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import preflight_cases
import pytest
import test_operator_support as support

from kmm.api import preflight
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs
from kmm.sandbox import testing

SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"

manifests = support.manifests

Obj = dict[str, Any]


@pytest.fixture
async def operator_api(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> AsyncIterator[kube_client.Client]:
    """A client acting as the deployed ServiceAccount, deploy/'s RBAC applied."""
    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    await applying.apply_documents(kmm_api, docs)
    access = dataclasses.replace(kubeconfigs.load(sandbox.kubeconfig), impersonate=SERVICE_ACCOUNT)
    async with kube_client.Client(access) as limited:
        yield limited


def _pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "build", "image": "example.com/builder:1"}],
        },
    }


async def test_operator_may_create_and_delete_pods(
    operator_api: kube_client.Client, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    made = await operator_api.send("POST", pods, query={"dryRun": "All"}, body=_pod("b"))
    assert made.status == 201
    # Allowed, and nothing there to delete: NotFound, not Forbidden.
    with pytest.raises(kube_errors.NotFound):
        await operator_api.request("DELETE", f"{pods}/absent")


async def test_operator_reads_configmaps_and_secrets_by_name_only(
    operator_api: kube_client.Client, namespace: str
) -> None:
    for resource in ("configmaps", "secrets"):
        base = f"/api/v1/namespaces/{namespace}/{resource}"
        with pytest.raises(kube_errors.NotFound):
            await operator_api.request("GET", f"{base}/absent")
        for query in ({}, {"watch": True, "timeoutSeconds": 1}):
            with pytest.raises(kube_errors.Forbidden):
                await operator_api.request("GET", base, query=query)
        with pytest.raises(kube_errors.Forbidden):
            await operator_api.request("GET", f"/api/v1/{resource}")
    with pytest.raises(kube_errors.Forbidden):
        await operator_api.request(
            "POST", f"/api/v1/namespaces/{namespace}/secrets", body={"metadata": {"name": "s"}}
        )


async def test_operator_may_not_read_pod_logs(
    operator_api: kube_client.Client, namespace: str
) -> None:
    with pytest.raises(kube_errors.Forbidden):
        await operator_api.request("GET", f"/api/v1/namespaces/{namespace}/pods/absent/log")


# -- preflight -----------------------------------------------------------------

_PREFLIGHTS = f"/apis/{preflight.GROUP}/{preflight.VERSION}/{preflight.PLURAL}"


@pytest.fixture
async def validation(manifests: None, kmm_api: kube_client.Client) -> AsyncIterator[Obj]:
    """A PreflightValidation made by the admin (cluster-scoped: deleted after)."""
    name = f"rbac-{uuid.uuid4().hex[:8]}"
    made: Obj = await kmm_api.request(
        "POST", _PREFLIGHTS, body=preflight_cases.validation(name=name)
    )
    try:
        yield made
    finally:
        await kmm_api.request("DELETE", f"{_PREFLIGHTS}/{name}")


def _owned_pod(name: str, owner: Obj, *, block: bool = True) -> Obj:
    pod = _pod(name)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": preflight.API_VERSION,
            "kind": preflight.KIND,
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": block,
        }
    ]
    return pod


async def test_operator_reads_preflight_validations_and_answers_through_status(
    operator_api: kube_client.Client, validation: Obj
) -> None:
    name = validation["metadata"]["name"]
    listed = await operator_api.request("GET", _PREFLIGHTS)
    assert name in {item["metadata"]["name"] for item in listed["items"]}
    # Allowed: the watch runs (to its one-second end) rather than being refused.
    async for _event in operator_api.watch(
        _PREFLIGHTS,
        query={"resourceVersion": listed["metadata"]["resourceVersion"]},
        timeout_seconds=1,
    ):
        pass
    verdict = {
        "name": "kmod",
        "namespace": "drivers",
        "verificationStatus": "InProgress",
        "verificationStage": "Image",
        "statusReason": preflight.REASON_IN_PROGRESS,
        "lastTransitionTime": "2026-07-01T12:00:00Z",
    }
    # The reconciler answers by merge patch of /status, and that is all it may do there.
    patched = await operator_api.request(
        "PATCH",
        f"{_PREFLIGHTS}/{name}/status",
        body={"status": {"observedGeneration": 1, "modules": [verdict]}},
        content_type=kube_client.MERGE_PATCH,
    )
    assert patched["status"]["modules"] == [verdict]
    one = {**validation, "status": patched["status"]}
    one["metadata"] = {**validation["metadata"], "resourceVersion": patched["metadata"]["resourceVersion"]}  # fmt: skip
    # Verbs the operator never uses are not granted: no get (its informer
    # lists and watches), no update of /status.
    for method, path, body in (
        ("GET", f"{_PREFLIGHTS}/{name}", None),
        ("GET", f"{_PREFLIGHTS}/{name}/status", None),
        ("PUT", f"{_PREFLIGHTS}/{name}/status", one),
    ):
        with pytest.raises(kube_errors.Forbidden):
            await operator_api.request(method, path, body=body)
    # The admin's question is not the operator's to change or remove.
    with pytest.raises(kube_errors.Forbidden):
        await operator_api.request("PUT", f"{_PREFLIGHTS}/{name}", body=one)
    with pytest.raises(kube_errors.Forbidden):
        await operator_api.request("DELETE", f"{_PREFLIGHTS}/{name}")
    with pytest.raises(kube_errors.Forbidden):
        await operator_api.request(
            "POST", _PREFLIGHTS, body=preflight_cases.validation(name=f"{name}-2")
        )


async def test_operator_may_create_pods_its_validation_owns_blocking_deletion(
    operator_api: kube_client.Client,
    kmm_api: kube_client.Client,
    sandbox: testing.RunningSandbox,
    validation: Obj,
    namespace: str,
) -> None:
    """The API server (OwnerReferencesPermissionEnforcement) lets an owner
    reference block its owner's deletion only for who may update the owner's
    /finalizers: the operator may; an account that may create pods only may not."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    made = await operator_api.send(
        "POST", pods, query={"dryRun": "All"}, body=_owned_pod("p", validation)
    )
    assert made.status == 201
    # The control: an account that may create pods and nothing else.
    account = "pods-only"
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
    await kmm_api.request(
        "POST",
        f"{rbac}/roles",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": account},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
        },
    )
    await kmm_api.request(
        "POST",
        f"{rbac}/rolebindings",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    access = dataclasses.replace(
        kubeconfigs.load(sandbox.kubeconfig),
        impersonate=f"system:serviceaccount:{namespace}:{account}",
    )
    async with kube_client.Client(access) as limited:
        plain = await limited.send(
            "POST", pods, query={"dryRun": "All"}, body=_owned_pod("p", validation, block=False)
        )
        assert plain.status == 201
        with pytest.raises(kube_errors.Forbidden) as refused:
            await limited.send(
                "POST", pods, query={"dryRun": "All"}, body=_owned_pod("p", validation)
            )
    assert "blockOwnerDeletion" in str(refused.value)
