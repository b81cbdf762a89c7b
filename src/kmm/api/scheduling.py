"""Pure node predicates the reconcilers share: selector match and "schedulable".

``matches_node_selector`` evaluates a core/v1 ``NodeSelector`` (as the
scheduler writes into a ResourceClaim's allocation) against a node: terms
are ORed, the requirements of one term ANDed; ``matchFields`` knows
``metadata.name``, the only field the API allows there.

DESIGN §5: a node is schedulable for a Module when it is not
``spec.unschedulable`` and every ``NoSchedule`` / ``NoExecute`` taint is
tolerated by the Module's tolerations. Toleration matching follows core/v1
``Toleration.ToleratesTaint``. Nodes are raw objects (mappings), as the
informer cache keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kmm.api import kubeobjects

__all__ = ["is_schedulable", "matches_node_selector", "matches_selector", "tolerates"]

_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def matches_selector(node_labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    """Equality match of ``spec.selector`` against a node's labels."""
    labels = node_labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


def tolerates(toleration: kubeobjects.Toleration, taint: Mapping[str, Any]) -> bool:
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
    node: Mapping[str, Any], tolerations: Sequence[kubeobjects.Toleration] | None
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


def _requirement(value: str | None, requirement: Mapping[str, Any]) -> bool:
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator we do not know matches nothing, as in the scheduler


def matches_node_selector(node: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    """Whether ``node`` satisfies a core/v1 NodeSelector."""
    metadata = node.get("metadata") or {}
    node_labels: Mapping[str, str] = metadata.get("labels") or {}
    fields = {"metadata.name": metadata.get("name")}
    for term in selector.get("nodeSelectorTerms") or ():
        expressions = term.get("matchExpressions") or ()
        matched_fields = term.get("matchFields") or ()
        if not expressions and not matched_fields:
            continue  # an empty term matches no node
        if all(_requirement(node_labels.get(r.get("key")), r) for r in expressions) and all(
            _requirement(fields.get(r.get("key")), r) for r in matched_fields
        ):
            return True
    return False
