"""The churn's own record is what it made (``tests/churning.py``).

``bench/churnbaseline.py`` computes the churn bench's baseline from the
churn's record of its nodes and Modules instead of from the cluster (where
the operator's writes are mixed in), so the record must hold exactly what
the API server holds: selectors, mappings, images, device plugin and
tolerations of every Module; labels, kernel, cordon and the churn's taint of
every node. No operator runs: the churn's writes alone, on a sandbox of
the test's own (the churn makes nodes), without pauses between changes.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from typing import Any

import churning
import pytest
import test_operator_support as support
import test_sandbox_lifecycle as lifecycle
from kubernetes_asyncio import client

from kmm.api import modules
from kmm.sandbox import testing

SEED = 3
CHANGES = 150


@pytest.fixture(scope="module")
def bare() -> Iterator[testing.RunningSandbox]:
    with lifecycle.own_sandbox("ch", nodes=0, kernels=churning.KERNELS[:1]) as sandbox:
        asyncio.run(support.install_manifests(sandbox.kubeconfig))
        yield sandbox


def _module_fields(spec: dict[str, Any]) -> dict[str, Any]:
    container = spec["moduleLoader"]["container"]
    return {
        "selector": spec.get("selector"),
        "tolerations": spec.get("tolerations"),
        "devicePlugin": spec.get("devicePlugin"),
        "containerImage": container.get("containerImage"),
        "kernelMappings": container.get("kernelMappings"),
    }


def _node_fields(node: dict[str, Any]) -> dict[str, Any]:
    spec = node.get("spec") or {}
    return {
        "labels": node["metadata"].get("labels") or {},
        "kernel": node["status"]["nodeInfo"]["kernelVersion"],
        "unschedulable": bool(spec.get("unschedulable")),
        "taints": [
            {k: t.get(k) for k in ("key", "value", "effect")}
            for t in spec.get("taints") or ()
            if t.get("key") == churning.TAINT_KEY
        ],
    }


async def test_the_cluster_holds_what_the_churn_recorded(bare: testing.RunningSandbox) -> None:
    api = await support.independent_client(bare.kubeconfig)
    async with api, support.own_namespace(api, "churning") as namespace:
        settings = churning.Settings(
            seed=SEED, namespace=namespace, min_nodes=5, max_nodes=15, pause=(0.0, 0.0)
        )
        churn = churning.Churn(api, settings)
        await churn.populate(10, 3)
        changes = await churn.run(CHANGES)
        kinds = collections.Counter(c.kind for c in changes)
        assert kinds["module-selector"] >= 3, "the seed must change selectors"

        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        for name in sorted(churn.modules):
            found = await custom.get_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
            )
            recorded = churn.module_body(name)["spec"]
            assert _module_fields(found["spec"]) == _module_fields(recorded), name
        for name in sorted(churn.nodes):
            response = await core.read_node(name, _preload_content=False)
            found = await response.json()
            recorded = churn.node_object(name)
            assert _node_fields(found) == _node_fields(recorded), name
