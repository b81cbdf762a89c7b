"""What is kept of ResourceSlices and DeviceTaintRules, and which Modules their events concern."""

from __future__ import annotations

import sys
import tracemalloc
from typing import Any

from kmm.api import labels
from kmm.operator import caches, devicecaches
from kmm.runtime import stores


def _slice(node: str, devices: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-gpu.example.com-x",
            "uid": f"uid-{node}",
            "resourceVersion": "3",
            "ownerReferences": [{"kind": "Node", "name": node, "uid": "n"}],
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "driver": "gpu.example.com",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"model": {"string": "x" * 40}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def test_a_slice_keeps_its_driver_pool_node_and_device_names_only() -> None:
    kept = devicecaches.project_slice(_slice("n0"))
    assert kept == {
        "metadata": {
            "name": "n0-gpu.example.com-x",
            devicecaches.FACTS: (
                "gpu.example.com",
                "n0",
                "n0",
                tuple(f"gpu-{i}" for i in range(8)),
            ),
        }
    }
    assert devicecaches.slice_devices(kept) == devicecaches.slice_devices(_slice("n0"))
    assert (devicecaches.slice_pool(kept), devicecaches.slice_node(kept)) == ("n0", "n0")
    assert devicecaches.slice_driver(kept) == "gpu.example.com"


def test_5000_slices_cost_a_few_mib_and_equal_device_lists_are_stored_once() -> None:
    nodes = [sys.intern(f"node-{i:05d}") for i in range(5000)]  # the Node cache's
    raw = [_slice(n) for n in nodes]
    first, second = (devicecaches.project_slice(r) for r in raw[:2])
    assert first["metadata"][devicecaches.FACTS][3] is second["metadata"][devicecaches.FACTS][3]
    store = stores.Store(indexers={devicecaches.DRIVER_INDEX: devicecaches.slice_driver_index})
    tracemalloc.start()
    try:
        for found in raw:
            store.put(devicecaches.project_slice(found))
        cost = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert cost < 3.5 * 2**20, cost  # 2.9 MiB measured (CPython 3.11)


def test_a_slice_without_a_node_is_on_no_single_node() -> None:
    shared = _slice("n0")
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    assert devicecaches.slice_node(devicecaches.project_slice(shared)) is None


def test_a_slice_event_concerns_the_modules_naming_its_driver() -> None:
    modules = stores.Store(indexers={caches.DRIVER_INDEX: caches.module_driver_index})
    for name, driver in (("a", "gpu.example.com"), ("b", "nic.example.com")):
        modules.put({"metadata": {"name": name, "namespace": "ns"}, "spec": {"dra": {"driverName": driver}}})  # fmt: skip
    assert devicecaches.modules_of_slice(_slice("n0"), modules) == ["ns/a"]


def test_a_rule_keeps_its_labels_annotations_and_spec_without_time_added() -> None:
    rule = {
        "metadata": {
            "name": "r",
            "uid": "u",
            "resourceVersion": "4",
            "generation": 2,
            "labels": {**labels.module_labels("ns", "m", "dra"), labels.MODULE_UID: "uid-1"},
            "annotations": {labels.TAINTED_NODE: "n0"},
            "managedFields": [{"manager": "kmm"}],
        },
        "spec": {
            "deviceSelector": {"driver": "gpu.example.com", "pool": "n0"},
            "taint": {
                "key": "k",
                "value": "v",
                "effect": "NoExecute",
                "timeAdded": "2026-01-01T00:00:00Z",
            },
        },
        "status": {
            "conditions": [
                {
                    "type": "EvictionInProgress",
                    "status": "True",
                    "reason": "PodsPendingEviction",
                    "message": "2 pods pending eviction, 1 evicted",
                    "lastTransitionTime": "2026-01-01T00:00:01Z",
                    "observedGeneration": 1,
                }
            ]
        },
    }
    kept = devicecaches.project_rule(rule)
    assert kept["spec"]["taint"] == {"key": "k", "value": "v", "effect": "NoExecute"}
    assert kept["status"] == {
        "conditions": [
            {
                "type": "EvictionInProgress",
                "status": "True",
                "message": "2 pods pending eviction, 1 evicted",
            }
        ]
    }
    assert devicecaches.eviction(kept) == "2 pods pending eviction, 1 evicted"
    assert devicecaches.eviction({"metadata": {"name": "new"}}) is None
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {labels.TAINTED_NODE: "n0"}
    assert caches.object_module_index(kept) == ("ns/m",)
    assert rule["spec"]["taint"]["timeAdded"]  # the event's object is left alone
