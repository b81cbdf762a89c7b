"""Kubernetes Events about a Module (core/v1), built purely and sent by ``writing``.

Events go out for what a user wants to see in ``kubectl describe module``:
DaemonSets created and deleted, and a spec the operator refuses (the
validation it repeats from admission). They are written only on a change,
never on a no-op reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from kmm.api import modules

__all__ = ["COMPONENT", "event"]

COMPONENT: Final = "kmm-operator"

RawObject = dict[str, Any]


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
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": modules.API_VERSION,
            "kind": modules.KIND,
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid", ""),
            "resourceVersion": metadata.get("resourceVersion", ""),
        },
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
