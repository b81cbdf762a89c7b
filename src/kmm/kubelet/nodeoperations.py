"""Node operations a claim's devices let the kubelet skip (1.37, ``DRAOptionalNodeOperations``).

A device's allocation result may list ``skipNodeOperations``
(``NodePrepareResources``, ``NodeUnprepareResources``, or ``*`` for all). The
1.37 kubelet (``claiminfo.go: computeDriverStates``) skips a call to a driver
for a claim only when *every* device of that driver in the claim skips it;
the result is kept per driver in the checkpoint. The gate is alpha and off by
default: then a claim with any skip fails its prepare, since the kubelet
would have to call a driver that may not serve the call. With the gate on,
the kubelet declares the feature in ``node.status.declaredFeatures``, which
the 1.37 scheduler requires of a node before it places such a claim there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["ALL", "FEATURE", "PREPARE", "UNPREPARE", "GateDisabled", "skipped", "skips"]

PREPARE: Final = "NodePrepareResources"
UNPREPARE: Final = "NodeUnprepareResources"
ALL: Final = "*"
# The gate's name, which is also the name the node declares.
FEATURE: Final = "DRAOptionalNodeOperations"


class GateDisabled(Exception):
    """A claim skips node operations and the gate is off."""


def skipped(results: Sequence[Mapping[str, Any]], *, enabled: bool) -> dict[str, tuple[str, ...]]:
    """Per driver of an allocation's results, the operations it skips (drivers
    skipping none left out): ``*`` when every device skips all, else each
    operation every device skips (by name or through ``*``), sorted. Unknown
    operation names are kept, as the kubelet keeps them; they skip nothing."""
    devices: Counter[str] = Counter()
    counts: dict[str, Counter[str]] = {}
    for result in results:
        driver = str(result.get("driver"))
        devices[driver] += 1
        listed = [str(op) for op in result.get("skipNodeOperations") or ()]
        if not listed:
            continue
        per_op = counts.setdefault(driver, Counter())
        if ALL in listed:  # subsumes the others of this result
            per_op[ALL] += 1
        else:
            per_op.update(listed)
    found: dict[str, tuple[str, ...]] = {}
    for driver, per_op in counts.items():
        every = per_op[ALL]
        if every == devices[driver]:
            ops: tuple[str, ...] = (ALL,)
        else:
            ops = tuple(
                sorted(op for op, n in per_op.items() if op != ALL and n + every == devices[driver])
            )
        if ops:
            found[driver] = ops
    if found and not enabled:
        raise GateDisabled(f"{FEATURE} feature gate is disabled on kubelet")
    return found


def skips(ops: Sequence[str], operation: str) -> bool:
    """``DriverState.Skips``: whether ``operation`` is skipped."""
    return ALL in ops or operation in ops
