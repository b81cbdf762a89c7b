"""Pure node predicates the reconcilers share: selector match and "schedulable".

DESIGN §5: a node is schedulable for a Module when it is not
``spec.unschedulable`` and every ``NoSchedule`` / ``NoExecute`` taint is
tolerated by the Module's tolerations. Toleration matching follows core/v1
``Toleration.ToleratesTaint``. Nodes are raw objects (mappings), as the
informer cache keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kmm.api import modules

__all__ = ["is_schedulable", "matches_selector", "tolerates"]

_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def matches_selector(node_labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    """Equality match of ``spec.selector`` against a node's labels."""
    labels = node_labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


def tolerates(toleration: modules.Toleration, taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (core/v1 semantics)."""
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.key is not None and toleration.key != "" and toleration.key != taint.get("key"):
        return False
    if toleration.operator == "Exists":
        return True
    # An empty key with operator Equal is invalid in Kubernetes; it matches nothing.
    if not toleration.key:
        return False
    return (toleration.value or "") == (taint.get("value") or "")


def is_schedulable(
    node: Mapping[str, Any], tolerations: Sequence[modules.Toleration] | None
) -> bool:
    """Whether a Module's pods may run on ``node`` (not cordoned, taints tolerated)."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in _BLOCKING_EFFECTS and not any(
            tolerates(toleration, taint) for toleration in tolerations or ()
        ):
            return False
    return True
