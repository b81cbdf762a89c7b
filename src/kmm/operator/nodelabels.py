"""The one place where the planners' wanted node labels become patches (pure).

Each planner says, per node, what value the label keys it owns should have
(``plans.Plan.labels``; ``None`` for absent). ``merge`` compares all of them
with each node's labels and returns, per node, one change: ``{label: value}``
to set, ``{label: None}`` to remove, which is also the body of a JSON merge
patch of ``metadata.labels``. A node already as wanted is absent, so a
converged Module patches nothing. ``still_needed`` trims a change against a
fresher copy of the node, just before it is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kmm.operator import plans

__all__ = ["LabelChanges", "merge", "still_needed"]

LabelChanges = dict[str, dict[str, str | None]]


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    return found


def still_needed(
    node: Mapping[str, Any], change: Mapping[str, str | None]
) -> dict[str, str | None]:
    """The part of ``change`` that ``node``'s labels do not show yet."""
    current = _labels(node)
    return {
        key: value
        for key, value in change.items()
        if (value is None and key in current) or (value is not None and current.get(key) != value)
    }


def merge(nodes: Mapping[str, Mapping[str, Any]], wanted: Iterable[plans.Plan]) -> LabelChanges:
    """Per node name, the labels to set or remove; nodes needing nothing are absent."""
    combined: dict[str, dict[str, str | None]] = {}
    for plan in wanted:
        for node, values in plan.labels.items():
            into = combined.setdefault(node, {})
            for key, value in values.items():
                if key in into and into[key] != value:
                    raise AssertionError(
                        f"two planners want {key} on {node}: {into[key]!r}, {value!r}"
                    )
                into[key] = value
    result: LabelChanges = {}
    for node, values in sorted(combined.items()):
        if node in nodes:
            change = still_needed(nodes[node], values)
            if change:
                result[node] = change
    return result
