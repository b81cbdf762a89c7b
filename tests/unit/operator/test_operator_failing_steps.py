"""Naming a reconcile's failures (``failures``) and the status they give (``status.failed``)."""

from __future__ import annotations

import operator_fixtures as fixtures
import pytest

from kmm.api import conditions
from kmm.kube import errors
from kmm.operator import failures, status


def test_a_step_names_what_failed_and_keeps_the_cause() -> None:
    cause = KeyError("kernel")
    with pytest.raises(failures.StepFailed) as raised, failures.step("planning the module loader"):
        raise cause
    assert raised.value.cause is cause
    assert raised.value.__cause__ is cause
    assert failures.describe(raised.value) == "planning the module loader: KeyError: 'kernel'"


def test_an_inner_step_is_the_one_named() -> None:
    with (
        pytest.raises(failures.StepFailed, match=r"^patching the labels of node n1: "),
        failures.step("sending"),
        failures.step("patching the labels of node n1"),
    ):
        raise errors.Forbidden(403, "nodes is forbidden", method="PATCH", path="/api/v1/nodes/n1")


@pytest.mark.parametrize(
    "error",
    [
        errors.Conflict(409, "modified"),
        errors.Throttled(429, "slow down"),
        errors.Unavailable(0, "connection refused"),
        errors.Fenced("PATCH", "/api/v1/nodes/n1"),
    ],
)
def test_transient_errors_pass_a_step_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as raised, failures.step("applying DaemonSet x"):
        raise error
    assert raised.value is error
    assert failures.transient(error)


def test_what_is_shown() -> None:
    assert not failures.transient(errors.Invalid(422, "bad"))
    assert not failures.transient(errors.Forbidden(403, "no"))
    assert not failures.transient(RuntimeError("bug"))
    assert failures.describe(RuntimeError("bug")) == "reconciling: RuntimeError: bug"
    long = failures.describe(RuntimeError("x" * 2000))
    assert len(long) == failures.MAX_MESSAGE
    assert long.endswith("…")


def test_a_failed_reconcile_leaves_ready_and_the_counts_as_they_were() -> None:
    raw = fixtures.module_raw()
    raw["metadata"]["generation"] = 2
    raw["status"] = {
        "moduleLoader": {
            "nodesMatchingSelectorNumber": 2,
            "desiredNumber": 2,
            "availableNumber": 2,
        },
        "observedGeneration": 1,
        "conditions": [
            {"type": t, "status": s, "reason": "AsExpected", "lastTransitionTime": "t0"}
            for t, s in (("Degraded", "False"), ("Ready", "True"), ("Progressing", "False"))
        ],
    }
    new = status.failed(raw, "applying DaemonSet x: 422 bad", now="t1")
    found = {c.type: c for c in new.conditions or ()}
    assert (found["Degraded"].status, found["Degraded"].reason) == (
        "True",
        conditions.REASON_RECONCILE_FAILED,
    )
    assert found["Degraded"].message == "applying DaemonSet x: 422 bad"
    assert found["Degraded"].last_transition_time == "t1"
    assert (found["Ready"].status, found["Ready"].last_transition_time) == ("True", "t0")
    assert new.module_loader is not None
    assert new.module_loader.available_number == 2
    # Generation 2 was not reconciled in full.
    assert new.observed_generation == 1
