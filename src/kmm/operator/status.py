"""A Module's status, computed from what the reconcile saw (pure).

Counts follow KMM: ``nodesMatchingSelectorNumber`` (nodes the DaemonSets'
selection starts from), ``desiredNumber`` and ``availableNumber`` (sums of
the DaemonSets' ``desiredNumberScheduled`` / ``numberAvailable``); with
ordered upgrades, ``versions`` gives the same sums per module version.
Conditions (ours, DESIGN §3) come from the node labels' truth, not from the
DaemonSets' lagging counters:

- Degraded: True with ``InvalidSpec``, ``KernelMappingFailed``, a write
  the API server refused (``DaemonSetRefused``, ``PodRefused``: a build or
  sign pod, or a DaemonSet's pods), a load that failed on a node
  (``ModuleLoadFailed``, ``loader.reports``) or a DRA problem
  (``ResourceAPIUnavailable``, ``DeviceClassConflict``,
  ``DeviceClassRefused``), else False; ``failed`` sets it alone, True with
  ``ReconcileFailed``, when planning or sending raised (``failures``);
- Ready: True when every targeted node has the module loaded (and its device
  plugin or DRA driver Ready where one should run), and no DRA problem
  stands in the way; ``NoMatchingNodes`` when none is targeted;
- Progressing: True (``RollingOut``) while some targeted node is not ready.

``deviceTaints`` (kmm's) says, for a DRA Module with ordered upgrades,
which resource.k8s.io version its DeviceTaintRules are written in, or why
none is used, and per node in a move its rules and the pods holding claims
on the tainted devices (``upgrade.taints``); it is no problem: an old
server's upgrades go on without taints.

``kmm.api.conditions.set_condition`` keeps transition times, and ``differs``
compares only the fields this reconciler owns, so a converged Module gets no
status write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic

from kmm.api import conditions, kubeobjects, labels, modules

__all__ = [
    "Observed",
    "Problem",
    "compute",
    "counts",
    "differs",
    "failed",
    "invalid",
    "only_progress",
    "patch_body",
]

RawObject = dict[str, Any]

# The status fields this reconciler writes.
_OWNED = (
    "moduleLoader",
    "devicePlugin",
    "dra",
    "conditions",
    "observedGeneration",
    "images",
    "imageRebuildTriggerGeneration",
    "deviceTaints",
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something that keeps the Module from working: a reason and its words."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Observed:
    """What a reconcile saw, in numbers. ``plugin_*`` count the device
    workload, device plugin or DRA driver (``devices`` names it)."""

    selected: int
    loader: modules.DaemonSetStatus | None
    plugin: modules.DaemonSetStatus | None
    targeted: int
    ready: int
    plugin_wanted: int
    plugin_ready: int
    mapping_errors: Mapping[str, str]
    dra: modules.DaemonSetStatus | None = None
    devices: str = "device plugins"
    problems: Sequence[Problem] = ()
    # Build and sign (``build.planner``): each concerned kernel's image, and
    # the spec.imageRebuildTriggerGeneration whose checks and builds are done.
    images: Sequence[modules.ImageStatus] = ()
    image_rebuild_trigger_generation: int | None = None
    # Device taints in ordered upgrades of a DRA Module (``upgrade.taints``).
    device_taints: modules.DeviceTaintsStatus | None = None


def counts(
    matching: int, daemonsets: Iterable[Mapping[str, Any]], *, versioned: bool = False
) -> modules.DaemonSetStatus:
    """KMM's counts over ``daemonsets``; with ``versioned``, also per module version."""
    desired = available = 0
    per_version: dict[str, list[int]] = {}
    for ds in daemonsets:
        status = ds.get("status") or {}
        wanted, up = (
            int(status.get("desiredNumberScheduled") or 0),
            int(status.get("numberAvailable") or 0),
        )
        desired += wanted
        available += up
        version = ((ds.get("metadata") or {}).get("labels") or {}).get(labels.MODULE_VERSION)
        if versioned and version:
            found = per_version.setdefault(version, [0, 0])
            found[0] += wanted
            found[1] += up
    return modules.DaemonSetStatus(
        nodes_matching_selector_number=matching,
        desired_number=desired,
        available_number=available,
        versions=[
            modules.VersionCounts(version=v, desired_number=d, available_number=a)
            for v, (d, a) in sorted(per_version.items())
        ]
        if versioned
        else None,
    )


def _old(raw: Mapping[str, Any]) -> modules.ModuleStatus | None:
    try:
        return modules.ModuleStatus.model_validate(raw.get("status") or {})
    except pydantic.ValidationError:
        return None  # a status we cannot read is rewritten whole


def compute(raw: Mapping[str, Any], seen: Observed, *, now: str) -> modules.ModuleStatus:
    old = _old(raw)
    generation = (raw.get("metadata") or {}).get("generation")
    found = old.conditions if old is not None else None
    problems = "; ".join(p.message for p in seen.problems)
    if seen.problems or seen.mapping_errors:
        detail = "; ".join(
            [
                *(p.message for p in seen.problems),
                *(f"{k}: {v}" for k, v in sorted(seen.mapping_errors.items())),
            ]
        )
        reason = (
            seen.problems[0].reason if seen.problems else conditions.REASON_KERNEL_MAPPING_FAILED
        )
        found = conditions.set_condition(
            found, conditions.DEGRADED, "True",
            reason=reason, message=detail, now=now, observed_generation=generation,
        )  # fmt: skip
    else:
        found = conditions.set_condition(
            found, conditions.DEGRADED, "False",
            reason=conditions.REASON_AS_EXPECTED, now=now, observed_generation=generation,
        )  # fmt: skip
    wanted = seen.targeted + seen.plugin_wanted
    done = seen.ready + seen.plugin_ready
    ready: tuple[conditions.Status, str, str]
    progressing: tuple[conditions.Status, str, str]
    message = f"{seen.ready}/{seen.targeted} nodes loaded"
    if seen.plugin is not None or seen.dra is not None:
        message += f", {seen.plugin_ready}/{seen.plugin_wanted} {seen.devices} ready"
    if wanted == 0:
        ready = ("False", conditions.REASON_NO_MATCHING_NODES, "no node is targeted")
        progressing = ("False", conditions.REASON_NO_MATCHING_NODES, "")
    elif done < wanted:
        ready = ("False", conditions.REASON_NODES_NOT_READY, message)
        progressing = ("True", conditions.REASON_ROLLING_OUT, message)
    else:
        ready = ("True", conditions.REASON_AS_EXPECTED, message)
        progressing = ("False", conditions.REASON_AS_EXPECTED, "")
    if seen.problems:
        ready = ("False", seen.problems[0].reason, problems)
    for type_, (state, reason, text) in (
        (conditions.READY, ready),
        (conditions.PROGRESSING, progressing),
    ):
        found = conditions.set_condition(
            found, type_, state,
            reason=reason, message=text, now=now, observed_generation=generation,
        )  # fmt: skip
    return modules.ModuleStatus(
        module_loader=seen.loader,
        device_plugin=seen.plugin,
        dra=seen.dra,
        conditions=found,
        observed_generation=generation,
        images=list(seen.images) or None,
        image_rebuild_trigger_generation=seen.image_rebuild_trigger_generation,
        device_taints=seen.device_taints,
    )


def invalid(raw: Mapping[str, Any], message: str, *, now: str) -> modules.ModuleStatus:
    """Status of a Module that breaks the admission rules: Degraded, nothing made."""
    old = _old(raw)
    generation = (raw.get("metadata") or {}).get("generation")
    found = old.conditions if old is not None else None
    states: tuple[tuple[str, conditions.Status], ...] = (
        (conditions.DEGRADED, "True"),
        (conditions.READY, "False"),
        (conditions.PROGRESSING, "False"),
    )
    for type_, state in states:
        found = conditions.set_condition(
            found, type_, state,
            reason=conditions.REASON_INVALID_SPEC, message=message, now=now,
            observed_generation=generation,
        )  # fmt: skip
    return _counts_kept(old, found, observed_generation=generation)


def failed(raw: Mapping[str, Any], message: str, *, now: str) -> modules.ModuleStatus:
    """Status of a Module whose reconcile raised: Degraded (``ReconcileFailed``).

    Everything else stays as last computed: the counts and Ready may still be
    true, and ``observedGeneration`` says which spec was last reconciled in
    full. A Ready or Progressing never computed is Unknown; the next reconcile
    that goes through (``compute``) sets all three again.
    """
    old = _old(raw)
    generation = (raw.get("metadata") or {}).get("generation")
    found = conditions.set_condition(
        old.conditions if old is not None else None, conditions.DEGRADED, "True",
        reason=conditions.REASON_RECONCILE_FAILED, message=message, now=now,
        observed_generation=generation,
    )  # fmt: skip
    for type_ in (conditions.READY, conditions.PROGRESSING):
        if conditions.find(found, type_) is None:
            found = conditions.set_condition(
                found, type_, "Unknown",
                reason=conditions.REASON_RECONCILE_FAILED, message=message, now=now,
                observed_generation=generation,
            )  # fmt: skip
    return _counts_kept(
        old, found, observed_generation=old.observed_generation if old is not None else None
    )


def _counts_kept(
    old: modules.ModuleStatus | None,
    found: list[kubeobjects.Condition] | None,
    *,
    observed_generation: int | None,
) -> modules.ModuleStatus:
    """``old``'s counts (none if there was no status) with these conditions."""
    return modules.ModuleStatus(
        module_loader=old.module_loader if old is not None else None,
        device_plugin=old.device_plugin if old is not None else None,
        dra=old.dra if old is not None else None,
        conditions=found,
        observed_generation=observed_generation,
        images=old.images if old is not None else None,
        image_rebuild_trigger_generation=(
            old.image_rebuild_trigger_generation if old is not None else None
        ),
        device_taints=old.device_taints if old is not None else None,
    )


def _owned(status: modules.ModuleStatus | None) -> dict[str, Any]:
    if status is None:
        return {}
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    return {key: dumped[key] for key in _OWNED if key in dumped}


def differs(raw: Mapping[str, Any], new: modules.ModuleStatus) -> bool:
    """Whether ``new`` changes any field this reconciler owns."""
    return _owned(_old(raw)) != _owned(new)


def patch_body(new: modules.ModuleStatus) -> RawObject:
    """A JSON merge patch of ``status``: owned fields set, absent ones removed."""
    owned = _owned(new)
    return {"status": {key: owned.get(key) for key in _OWNED}}


def _states(status: modules.ModuleStatus | None) -> tuple[object, ...]:
    if status is None:
        return ()
    found = sorted(
        (c.type, c.status, c.reason, c.observed_generation) for c in status.conditions or ()
    )
    return (status.observed_generation, tuple(found))


def only_progress(raw: Mapping[str, Any], new: modules.ModuleStatus) -> bool:
    """Whether ``new`` differs from the observed status only in counts and
    messages (no condition changes state or reason, no new generation)."""
    old = _old(raw)
    return old is not None and bool(old.conditions) and _states(old) == _states(new)
