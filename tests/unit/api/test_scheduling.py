"""Schedulable node and selector predicates (DESIGN §5)."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.api import kubeobjects, scheduling

_NO_SCHEDULE = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}


def _node(
    *, unschedulable: bool = False, taints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"spec": {"unschedulable": unschedulable, "taints": taints or []}}


@pytest.mark.parametrize(
    ("node", "tolerations", "schedulable"),
    [
        (_node(), [], True),
        (_node(unschedulable=True), [], False),
        (_node(taints=[_NO_SCHEDULE]), [], False),
        (_node(taints=[{"key": "x", "effect": "PreferNoSchedule"}]), [], True),
        (_node(taints=[_NO_SCHEDULE]), [{"key": "gpu", "operator": "Exists"}], True),
        (_node(taints=[_NO_SCHEDULE]), [{"key": "gpu", "value": "yes"}], True),
        (_node(taints=[_NO_SCHEDULE]), [{"key": "gpu", "value": "no"}], False),
        (_node(taints=[_NO_SCHEDULE]), [{"operator": "Exists"}], True),
        (
            _node(taints=[_NO_SCHEDULE]),
            [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
            False,
        ),
        (_node(taints=[_NO_SCHEDULE]), [{"key": "gpu", "operator": "Exists", "effect": ""}], True),
        ({}, [], True),
    ],
)
def test_is_schedulable(
    node: dict[str, Any], tolerations: list[dict[str, Any]], schedulable: bool
) -> None:
    parsed = [kubeobjects.Toleration.model_validate(t) for t in tolerations]
    assert scheduling.is_schedulable(node, parsed) is schedulable


@pytest.mark.parametrize(
    ("node_labels", "selector", "matches"),
    [
        ({"a": "1", "b": "2"}, {"a": "1"}, True),
        ({"a": "1"}, {"a": "2"}, False),
        (None, {}, True),
        (None, {"a": ""}, False),
        ({"a": ""}, {"a": ""}, True),
    ],
)
def test_matches_selector(
    node_labels: dict[str, str] | None, selector: dict[str, str], matches: bool
) -> None:
    assert scheduling.matches_selector(node_labels, selector) is matches
