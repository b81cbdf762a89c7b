"""Module status conditions: their types, reasons, and the one way to set them.

DESIGN §3: ``status.conditions`` carries Ready / Progressing / Degraded with
reasons. ``set_condition`` keeps ``lastTransitionTime`` when the status does
not change, so a converged reconcile rewrites nothing (a no-op reconcile must
make zero writes). Time is passed in: this package does no I/O, clocks included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from kmm.api import kubeobjects

__all__ = [
    "DEGRADED",
    "PROGRESSING",
    "READY",
    "REASON_AS_EXPECTED",
    "REASON_DAEMONSET_REFUSED",
    "REASON_DEVICE_CLASS_CONFLICT",
    "REASON_DEVICE_CLASS_REFUSED",
    "REASON_INVALID_SPEC",
    "REASON_KERNEL_MAPPING_FAILED",
    "REASON_MODULE_LOAD_FAILED",
    "REASON_NODES_NOT_READY",
    "REASON_NO_MATCHING_NODES",
    "REASON_POD_REFUSED",
    "REASON_RECONCILE_FAILED",
    "REASON_RESOURCE_API_UNAVAILABLE",
    "REASON_ROLLING_OUT",
    "find",
    "set_condition",
]

READY: Final = "Ready"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"

# Reasons are CamelCase, as metav1.Condition requires.
REASON_AS_EXPECTED: Final = "AsExpected"
REASON_ROLLING_OUT: Final = "RollingOut"
REASON_NODES_NOT_READY: Final = "NodesNotReady"
REASON_NO_MATCHING_NODES: Final = "NoMatchingNodes"
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_KERNEL_MAPPING_FAILED: Final = "KernelMappingFailed"
REASON_RESOURCE_API_UNAVAILABLE: Final = "ResourceAPIUnavailable"
REASON_DEVICE_CLASS_CONFLICT: Final = "DeviceClassConflict"
REASON_DEVICE_CLASS_REFUSED: Final = "DeviceClassRefused"
# The API server refused a DaemonSet write (invalid, forbidden, its own
# error): the message names the DaemonSet and quotes the server. The other
# DaemonSets and the rest of the reconcile went ahead.
REASON_DAEMONSET_REFUSED: Final = "DaemonSetRefused"
# A pod is refused: a build or sign pod the operator creates, or the pods of
# one of its DaemonSets (Pod Security, a quota, a missing service account, a
# namespace being deleted); the message names the pod or DaemonSet.
REASON_POD_REFUSED: Final = "PodRefused"
# A loader pod's hook failed on a node: the message names the nodes, the
# module and what the hook reported (the kernel's answer to modprobe, a
# module of another build still in use); those nodes get no ``.ready``.
REASON_MODULE_LOAD_FAILED: Final = "ModuleLoadFailed"
# Planning or sending failed in a way retrying alone may not fix (a bug, an
# object the API server refuses); the message names the step.
REASON_RECONCILE_FAILED: Final = "ReconcileFailed"

Status = Literal["True", "False", "Unknown"]


def find(
    conditions: Sequence[kubeobjects.Condition] | None, type_: str
) -> kubeobjects.Condition | None:
    """The condition of ``type_``, if present."""
    return next((c for c in conditions or () if c.type == type_), None)


def set_condition(
    conditions: Sequence[kubeobjects.Condition] | None,
    type_: str,
    status: Status,
    *,
    reason: str,
    message: str = "",
    now: str,
    observed_generation: int | None = None,
) -> list[kubeobjects.Condition]:
    """``conditions`` with ``type_`` set; other conditions keep their order.

    ``now`` (RFC 3339) becomes ``lastTransitionTime`` only when the status
    changes; an unchanged condition is returned equal to the old one.
    """
    old = find(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = kubeobjects.Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=observed_generation,
    )
    result = [new if c.type == type_ else c for c in conditions or ()]
    if old is None:
        result.append(new)
    return result
