"""Condition setting keeps transition times, so converged status is unchanged."""

from __future__ import annotations

from kmm.api import conditions


def test_set_condition_keeps_time_when_status_holds() -> None:
    first = conditions.set_condition(
        None, conditions.READY, "False", reason=conditions.REASON_ROLLING_OUT, now="t1"
    )
    assert [(c.type, c.status, c.last_transition_time) for c in first] == [("Ready", "False", "t1")]
    same = conditions.set_condition(
        first, conditions.READY, "False", reason=conditions.REASON_ROLLING_OUT, now="t2"
    )
    assert same == first
    flipped = conditions.set_condition(
        same, conditions.READY, "True", reason=conditions.REASON_AS_EXPECTED, now="t3"
    )
    ready = conditions.find(flipped, conditions.READY)
    assert ready is not None
    assert (ready.status, ready.last_transition_time) == ("True", "t3")


def test_set_condition_keeps_order_and_others() -> None:
    cs = conditions.set_condition(None, conditions.READY, "True", reason="AsExpected", now="t")
    cs = conditions.set_condition(cs, conditions.DEGRADED, "False", reason="AsExpected", now="t")
    cs = conditions.set_condition(cs, conditions.READY, "False", reason="NodesNotReady", now="u")
    assert [c.type for c in cs] == ["Ready", "Degraded"]
    dumped = cs[0].model_dump(mode="json", exclude_none=True)
    assert dumped == {
        "type": "Ready",
        "status": "False",
        "reason": "NodesNotReady",
        "message": "",
        "lastTransitionTime": "u",
    }
