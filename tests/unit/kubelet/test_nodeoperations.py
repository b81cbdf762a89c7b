"""Skipped node operations per driver, against the 1.37.2 kubelet's own
``pkg/kubelet/cm/dra/claiminfo_test.go`` (TestNewClaimInfoSkipNodeOperations)."""

from __future__ import annotations

import pytest

from kmm.kubelet import nodeoperations as ops

PREPARE, UNPREPARE, ALL = ops.PREPARE, ops.UNPREPARE, ops.ALL

# driver, device, skipNodeOperations: the Go test's allocation results.
RESULTS = [
    ("driver-a", "dev1", [ALL]),
    ("driver-a", "dev2", [ALL]),
    ("driver-b", "dev3", [ALL]),
    ("driver-b", "dev4", None),
    ("driver-c", "dev5", [UNPREPARE]),
    ("driver-d", "dev6", [ALL]),
    ("driver-d", "dev7", [UNPREPARE]),
    ("driver-e", "dev8", [UNPREPARE]),
    ("driver-e", "dev9", None),
    ("driver-f", "dev10", ["UnknownRpcCall"]),
    ("driver-g", "dev11", [ALL, PREPARE]),
    ("driver-g", "dev12", [PREPARE]),
    ("driver-h", "dev13", [UNPREPARE]),
    ("driver-h", "dev14", [ALL, PREPARE]),
]


def _results() -> list[dict[str, object]]:
    return [{"driver": d, "device": n, "skipNodeOperations": s} for d, n, s in RESULTS]


def test_an_operation_is_skipped_when_every_device_of_the_driver_skips_it() -> None:
    found = ops.skipped(_results(), enabled=True)
    assert found == {
        "driver-a": (ALL,),  # all devices skip all
        # driver-b: one device skips nothing; driver-e: likewise
        "driver-c": (UNPREPARE,),
        "driver-d": (UNPREPARE,),  # "*" and NodeUnprepareResources
        "driver-f": ("UnknownRpcCall",),  # kept, skipping nothing
        "driver-g": (PREPARE,),
        "driver-h": (UNPREPARE,),
    }
    assert not ops.skips(found["driver-f"], PREPARE)
    assert not ops.skips(found["driver-f"], UNPREPARE)
    assert ops.skips(found["driver-a"], PREPARE)
    assert ops.skips(found["driver-a"], UNPREPARE)
    assert ops.skips(found["driver-g"], PREPARE)
    assert not ops.skips(found["driver-g"], UNPREPARE)


def test_with_the_gate_off_a_skip_fails_and_no_skip_is_fine() -> None:
    with pytest.raises(
        ops.GateDisabled, match="DRAOptionalNodeOperations feature gate is disabled"
    ):
        ops.skipped(
            [{"driver": "driver-a", "device": "dev1", "skipNodeOperations": [ALL]}], enabled=False
        )
    assert ops.skipped([{"driver": "d", "device": "x"}], enabled=False) == {}
