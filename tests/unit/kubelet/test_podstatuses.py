"""The pod conditions the emulator writes: the kubelet's own, and the others kept."""

from __future__ import annotations

from kmm.kubelet import podstatuses


def test_conditions_others_own_survive_the_kubelets_status_write() -> None:
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByDeviceTaintManager",
    }
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}
    stale_ready = {"type": "Ready", "status": "True", "lastTransitionTime": "t0"}
    pod = {"status": {"conditions": [scheduled, disruption, stale_ready]}}
    found = podstatuses.pod_conditions(pod, initialized=True, ready=False, started="t1")
    by_type = {c["type"]: c for c in found}
    assert by_type["DisruptionTarget"] == disruption
    assert by_type["PodScheduled"] == scheduled  # carried over as it was
    assert by_type["Ready"]["status"] == "False"  # the kubelet's own, written afresh
    assert [c["type"] for c in found].count("Ready") == 1


def test_a_pod_without_conditions_is_scheduled_when_it_starts() -> None:
    found = podstatuses.pod_conditions({}, initialized=False, ready=False, started="t1")
    assert [c["type"] for c in found] == [
        "PodScheduled",
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
    ]
