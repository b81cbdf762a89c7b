"""Kubernetes Events about a Module (core/v1), built purely and sent by ``writing``.

Events go out for what a user wants to see in ``kubectl describe module``:
DaemonSets created and deleted, a spec the operator refuses (the
validation it repeats from admission), and a reconcile that failed
(``ReconcileFailed``, once per distinct message, not per retry: the
reconciler remembers the last one per Module); and on the Node (``kubectl describe
node``), the module loaded or unloaded there. They are written only on a
change, never on a no-op reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from kmm.api import modules

__all__ = ["COMPONENT", "event", "node_event"]

COMPONENT: Final = "kmm-operator"

RawObject = dict[str, Any]


def _event(
    involved: RawObject,
    namespace: str,
    *,
    type_: Literal["Normal", "Warning"],
    reason: str,
    message: str,
    now: str,
    instance: str,
) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def node_event(
    node: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    now: str,
    instance: str,
) -> RawObject:
    """A Normal core/v1 Event about a Node (cluster-scoped: kept in ``default``)."""
    metadata = node.get("metadata") or {}
    involved = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": metadata["name"],
        "uid": metadata.get("uid", ""),
    }
    return _event(
        involved,
        "default",
        type_="Normal",
        reason=reason,
        message=message,
        now=now,
        instance=instance,
    )


def event(
    module: Mapping[str, Any],
    *,
    type_: Literal["Normal", "Warning"],
    reason: str,
    message: str,
    now: str,
    instance: str,
) -> RawObject:
    """A core/v1 Event about ``module`` (a raw Module object)."""
    metadata = module.get("metadata") or {}
    involved = {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "name": metadata["name"],
        "namespace": metadata["namespace"],
        "uid": metadata.get("uid", ""),
        "resourceVersion": metadata.get("resourceVersion", ""),
    }
    return _event(
        involved,
        metadata["namespace"],
        type_=type_,
        reason=reason,
        message=message,
        now=now,
        instance=instance,
    )
