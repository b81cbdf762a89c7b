"""bench/churnbaseline.py: the churn's changes and the cluster's pods make the
baseline; the operator's own churn does not raise it."""

from __future__ import annotations

import copy
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import expectations

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import churnbaseline

from kmm.api import modules
from kmm.sandbox.kwoknodes import nodes

NS = "churn"
KERNEL = "6.8.0-45-generic"


def module(*, plugin: bool = False, tolerate: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"pool": "a"},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "m"},
                "containerImage": "example.com/m:${KERNEL_FULL_VERSION}",
                "kernelMappings": [{"regexp": r"^6\.8\."}],
            }
        },
    }
    if plugin:
        spec["devicePlugin"] = {"container": {"image": "example.com/plugin:v1"}}
    if tolerate:
        spec["tolerations"] = [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": "m1", "namespace": NS},
        "spec": spec,
    }


def node(pool: str = "a") -> dict[str, Any]:
    body = nodes.node_body("n1", KERNEL)
    body["metadata"]["labels"]["pool"] = pool
    body["spec"] = {"unschedulable": False, "taints": []}
    return body


def pods_for(
    mod: dict[str, Any], *, ready: bool, suffix: str, running: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The daemon pods the spec puts on n1 for ``mod`` (with ``running``
    there), as the cluster would report them."""
    snapshot = expectations.Snapshot(NS, [mod], [node()], [], list(running))
    found = []
    for index, identity in enumerate(expectations.expect(snapshot).pods["n1"]):
        found.append(
            {
                "metadata": {
                    "name": f"pod-{index}-{suffix}",
                    "namespace": NS,
                    "labels": dict(identity),
                },
                "spec": {"nodeName": "n1"},
                "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
            }
        )
    return found


def start(mod: dict[str, Any]) -> dict[churnbaseline.Kind, list[dict[str, Any]]]:
    """n1 selected, the loader (and plugin) Ready there: converged."""
    # The plugin's pod runs only where the module is loaded: the loader's first.
    pods = pods_for(mod, ready=True, suffix="0", running=pods_for(mod, ready=True, suffix="0"))
    return {"nodes": [node()], "modules": [mod], "pods": pods}


def pod_input(revision: int, pod: dict[str, Any], *, gone: bool = False) -> churnbaseline.Input:
    key = f"{NS}/{pod['metadata']['name']}"
    return churnbaseline.Input(revision, "pods", key, None if gone else pod)


def test_pods_the_operator_churned_raise_nothing() -> None:
    """The loader's pod deleted and made again (an operator that deleted and
    recreated its DaemonSet): no change of the churn's, so no write owed."""
    mod = module()
    begun = start(mod)
    (old,) = begun["pods"]
    (pending,) = pods_for(mod, ready=False, suffix="1")
    ready = copy.deepcopy(pending)
    ready["status"]["conditions"][0]["status"] = "True"
    terminating = copy.deepcopy(old)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    inputs = [
        pod_input(11, terminating),
        pod_input(12, old, gone=True),
        pod_input(13, pending),
        pod_input(14, ready),
    ]

    found = churnbaseline.baseline(NS, begun, inputs, finalizers=0)

    assert found == {"finalizer": 0}


def test_changes_and_the_pods_they_bring_are_counted() -> None:
    """n1 leaves the selector (.ready goes, kernel-version.full may stay; the
    DaemonSet is no longer wanted), comes back (the DaemonSet again), and the
    cluster makes the new loader pod Ready (.ready again)."""
    mod = module()
    begun = start(mod)
    (old,) = begun["pods"]
    (new,) = pods_for(mod, ready=True, suffix="1")
    inputs = [
        churnbaseline.Input(20, "nodes", "n1", node(pool="b")),
        pod_input(21, old, gone=True),
        churnbaseline.Input(22, "nodes", "n1", node(pool="a")),
        pod_input(23, new),
    ]

    found = churnbaseline.baseline(NS, begun, inputs, finalizers=0)

    assert found == {"node label patch": 2, "DaemonSet write": 2, "finalizer": 0}


def test_a_rolled_device_plugin_is_counted_down_and_up() -> None:
    """Tolerations change both DaemonSets; the device plugin's (not OnDelete)
    rolls its pod, so its Ready label goes, and comes back with the new pod;
    the loader's pod (OnDelete) stays."""
    mod = module(plugin=True)
    begun = start(mod)
    assert len(begun["pods"]) == 2
    changed = module(plugin=True, tolerate=True)
    plugin_pods = [
        p
        for p in pods_for(changed, ready=True, suffix="1", running=begun["pods"])
        if "device-plugin" in str(p)
    ]
    inputs = [
        churnbaseline.Input(30, "modules", "m1", changed),
        *(pod_input(31, p) for p in plugin_pods),
    ]

    found = churnbaseline.baseline(NS, begun, inputs, finalizers=0)

    assert found == {"node label patch": 2, "DaemonSet write": 2, "finalizer": 0}
