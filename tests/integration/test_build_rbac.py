"""What build and sign add to the deployed RBAC, checked as the operator's
ServiceAccount (impersonated) on the real API server: pods made and removed,
ConfigMaps and Secrets read by name; no Secret listed or watched, no pod log."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import test_operator_support as support

from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs
from kmm.sandbox import testing

SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"


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


def _pod(name: str) -> dict[str, object]:
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
