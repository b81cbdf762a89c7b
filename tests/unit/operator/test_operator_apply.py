"""``kmm apply``'s document loading, and the deploy/ manifests it applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.cli import applying

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_documents_split_and_lists_flattened() -> None:
    text = """
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ServiceAccount, metadata: {name: b}}
- {apiVersion: v1, kind: ServiceAccount, metadata: {name: c}}
"""
    names = [doc["metadata"]["name"] for doc in applying.load_documents(text)]
    assert names == ["a", "b", "c"]


def test_not_an_object_is_refused() -> None:
    with pytest.raises(applying.ApplyError):
        applying.load_documents("- a\n- b\n")


@pytest.mark.parametrize(
    "path",
    ["rbac/operator.yaml", "operator/namespace.yaml", "operator/deployment.yaml",
     "operator/examples/demo-module.yaml"],
)  # fmt: skip
def test_deploy_files_load(path: str) -> None:
    docs = applying.load_documents((DEPLOY / path).read_text())
    assert docs
    assert all({"apiVersion", "kind", "metadata"} <= set(doc) for doc in docs)


def test_rbac_grants_what_the_writer_sends() -> None:
    docs = applying.load_documents((DEPLOY / "rbac/operator.yaml").read_text())
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for needed in [
        ("apps", "daemonsets", "patch"),
        ("apps", "daemonsets", "delete"),
        ("", "nodes", "patch"),
        ("kmm.sigs.x-k8s.io", "modules/status", "patch"),
        ("kmm.sigs.x-k8s.io", "modules", "patch"),
        ("", "events", "create"),
    ]:
        assert needed in granted
    # Secrets are read by name (build and sign inputs), never listed or watched.
    assert {verb for _, resource, verb in granted if resource == "secrets"} == {"get"}
