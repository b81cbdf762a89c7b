"""What the caches keep of Nodes and pods: no time that only tells objects apart.

Equal values outside ``metadata`` are stored once (``stores.keep_fields``);
a per-object time in a taint or a condition kept 5,000 otherwise equal
lists apart. These tests check that the times go, that what the reconciler
reads stays, that equal lists become one object, and that the listed
object itself is left as it was.
"""

from __future__ import annotations

import copy
from typing import Any

from kmm.api import kubeobjects, labels, scheduling
from kmm.operator import caches, views

Obj = dict[str, Any]

_UNREACHABLE = "node.kubernetes.io/unreachable"


def _node(name: str, added: str) -> Obj:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": {}},
        "spec": {
            "podCIDR": "10.0.0.0/24",
            "taints": [
                {"key": _UNREACHABLE, "effect": "NoExecute", "timeAdded": added},
                {"key": _UNREACHABLE, "effect": "NoSchedule"},
            ],
        },
        "status": {"nodeInfo": {"kernelVersion": "6.8.0-45-generic"}},
    }


def test_nodes_keep_their_taints_without_the_time_they_were_added() -> None:
    listed = [_node("a", "2026-12-01T00:00:00Z"), _node("b", "2026-12-01T00:00:07Z")]
    as_listed = copy.deepcopy(listed)
    a, b = (caches.project_node(node) for node in listed)
    assert a["spec"] == {
        "taints": [
            {"key": _UNREACHABLE, "effect": "NoExecute"},
            {"key": _UNREACHABLE, "effect": "NoSchedule"},
        ]
    }
    assert a["spec"] is b["spec"]  # stored once for both nodes
    assert listed == as_listed
    assert a["status"]["nodeInfo"]["kernelVersion"] == "6.8.0-45-generic"
    # Scheduling still sees the taints.
    assert not scheduling.is_schedulable(a, [])
    tolerating = [kubeobjects.Toleration(key=_UNREACHABLE, operator="Exists")]
    assert scheduling.is_schedulable(a, tolerating)


def _pod(name: str, role: str, since: str) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": labels.module_labels("ns", "m", role),  # type: ignore[arg-type]
        },
        "spec": {"nodeName": f"node-{name}"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": since}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
        },
    }


def test_daemon_pods_keep_their_conditions_without_times() -> None:
    listed = [_pod("a", "module-loader", "2026-12-01T00:00:00Z")]
    listed.append(_pod("b", "module-loader", "2026-12-01T00:00:03Z"))
    as_listed = copy.deepcopy(listed)
    a, b = (caches.project_pod(pod) for pod in listed)
    assert a["status"]["conditions"] == [
        {"type": kind, "status": "True"}
        for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    assert a["status"] is b["status"]  # stored once for both pods
    assert listed == as_listed
    assert views.is_pod_ready(a)
    assert views.is_pod_ready(b)


def test_build_pods_keep_their_conditions_whole() -> None:
    pod = _pod("build", "build", "2026-12-01T00:00:00Z")
    assert caches.project_pod(pod)["status"]["conditions"] == pod["status"]["conditions"]


def test_nodes_keep_their_boot_id_beside_their_metadata_and_still_share_their_status() -> None:
    a, b = _node("a", "2026-12-01T00:00:00Z"), _node("b", "2026-12-01T00:00:00Z")
    a["status"]["nodeInfo"]["bootID"] = "0d6e1c51-0000-4000-8000-00000000000a"
    b["status"]["nodeInfo"]["bootID"] = "0d6e1c51-0000-4000-8000-00000000000b"
    kept_a, kept_b = caches.project_node(a), caches.project_node(b)
    assert caches.boot_id(kept_a) == caches.boot_id(a) == a["status"]["nodeInfo"]["bootID"]
    assert caches.boot_id(kept_b) == b["status"]["nodeInfo"]["bootID"]
    assert kept_a["status"] is kept_b["status"]  # one kernel, stored once
    assert caches.project_node(kept_a) == kept_a  # projecting again keeps it
    # KWOK's nodes report none: nothing is kept.
    kwok = _node("k", "2026-12-01T00:00:00Z")
    kwok["status"]["nodeInfo"]["bootID"] = ""
    assert caches.BOOT_ID not in caches.project_node(kwok)["metadata"]
    assert caches.boot_id(caches.project_node(kwok)) == ""


def _running(pod: Obj, *starts: str) -> Obj:
    pod["status"]["containerStatuses"] = [
        {"name": f"c{i}", "restartCount": 3, "state": {"running": {"startedAt": at}}}
        for i, at in enumerate(starts)
    ]
    return pod


def test_daemon_pods_keep_when_their_running_container_started_and_share_their_status() -> None:
    a = _running(_pod("a", "module-loader", "2026-12-01T00:00:00Z"), "2026-12-01T00:00:01Z")
    b = _running(_pod("b", "device-plugin", "2026-12-01T00:00:03Z"), "2026-12-01T00:00:04Z")
    kept_a, kept_b = caches.project_pod(a), caches.project_pod(b)
    assert caches.started(kept_a) == caches.started(a) == "2026-12-01T00:00:01Z"
    assert caches.started(kept_b) == "2026-12-01T00:00:04Z"
    assert "containerStatuses" not in kept_a["status"]
    assert kept_a["status"] is kept_b["status"]
    # The latest start of its running containers; none while none runs.
    two = _running(_pod("c", "dra", "x"), "2026-12-01T00:00:09Z", "2026-12-01T00:00:02Z")
    assert caches.started(caches.project_pod(two)) == "2026-12-01T00:00:09Z"
    waiting = _pod("d", "module-loader", "x")
    waiting["status"]["containerStatuses"] = [{"name": "c", "state": {"waiting": {}}}]
    assert caches.started(caches.project_pod(waiting)) is None
    # Build pods keep their statuses whole; they have no start of this kind.
    build = _running(_pod("e", "build", "x"), "2026-12-01T00:00:01Z")
    assert caches.started(caches.project_pod(build)) is None
