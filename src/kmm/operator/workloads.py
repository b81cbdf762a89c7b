"""What the device plugin and the DRA driver share: one DaemonSet per Module
(per version with ordered upgrades) running where the module is loaded.

``WorkloadPlan`` is the answer both planners give (``deviceplugin``, ``dra``);
the upgrade planner and the status read it without knowing which one it is.
``sync_daemonsets`` keeps the Module's DaemonSets of one role in step with the
one desired: sent when missing or when its ``SPEC_HASH`` differs, a DaemonSet
of an older *version* kept while nodes still run it
(``loader.planner.keep_old_version``), anything else deleted. An unversioned
DaemonSet left from before a versioned ``moduleLoader`` was added is deleted
at once: no version label will ever take its nodes away from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kmm.api import labels
from kmm.operator import objects, plans, views
from kmm.operator.loader import planner as loader_planner

__all__ = ["WorkloadPlan", "ready_nodes", "sync_daemonsets"]

RawObject = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


@dataclasses.dataclass
class WorkloadPlan(plans.Plan):
    """A device workload's wants and facts.

    ``enabled``: the Module has this part; ``noun``: how steps and messages
    name its pods; ``current``: its DaemonSets kept; ``eligible``: nodes where
    it would run once the version label lets it (all of ``wanted`` without a
    version); ``wanted``: nodes where a pod should run now; ``ready``: nodes
    where one is Ready.
    """

    enabled: bool = False
    noun: str = "device-plugin"
    current: list[RawObject] = dataclasses.field(default_factory=list)
    eligible: set[str] = dataclasses.field(default_factory=set)
    wanted: set[str] = dataclasses.field(default_factory=set)
    ready: set[str] = dataclasses.field(default_factory=set)


def sync_daemonsets(
    into: WorkloadPlan,
    existing: Sequence[RawObject],
    desired: RawObject | None,
    version: str | None,
) -> None:
    """Fill ``into.current``, ``apply`` and ``delete`` for one role's DaemonSets."""
    wanted_name = _meta(desired)["name"] if desired is not None else None
    seen = False
    for ds in sorted(existing, key=lambda obj: _meta(obj)["name"]):
        name, deleting = _meta(ds)["name"], _meta(ds).get("deletionTimestamp")
        ds_version = (_meta(ds).get("labels") or {}).get(labels.MODULE_VERSION)
        if desired is not None and name == wanted_name:
            seen = True
            into.current.append(ds)
            if not deleting and objects.observed_hash(ds) != objects.observed_hash(desired):
                into.apply.append(desired)
        elif (
            desired is not None
            and version is not None
            and ds_version is not None
            and ds_version != version
            and loader_planner.keep_old_version(ds)
        ):
            into.current.append(ds)  # nodes still run this version
        elif not deleting:
            into.delete.append(name)
    if desired is not None and not seen:
        into.apply.append(desired)


def ready_nodes(view: views.ModuleView, pods: Sequence[RawObject]) -> set[str]:
    """Nodes where one of ``pods`` is Ready in the node's current boot (``view.ready``)."""
    return {
        node
        for pod in pods
        if (node := (pod.get("spec") or {}).get("nodeName")) and view.ready(pod)
    }
