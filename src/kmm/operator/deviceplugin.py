"""The device plugin's plan for one Module (pure).

One device-plugin DaemonSet per Module with ``spec.devicePlugin``, sent when
missing or when its ``SPEC_HASH`` differs, deleted when ``devicePlugin`` is
removed. The node label ``<ns>.<name>.device-plugin-ready`` follows the
readiness of the plugin pod on that node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kmm.api import modules, scheduling
from kmm.operator import devicepluginbuilders, moduleloader, objects

__all__ = ["PluginPlan", "matching_nodes", "plan", "ready_nodes"]

RawObject = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PluginPlan:
    desired: RawObject | None
    to_apply: list[RawObject]
    to_delete: list[str]
    current: list[RawObject]


def plan(module: modules.Module, existing: Iterable[RawObject]) -> PluginPlan:
    """``existing`` are the Module's device-plugin DaemonSets."""
    desired = (
        devicepluginbuilders.daemonset(module) if module.spec.device_plugin is not None else None
    )
    wanted = desired["metadata"]["name"] if desired is not None else None
    to_apply: list[RawObject] = []
    to_delete: list[str] = []
    current: list[RawObject] = []
    seen = False
    for ds in existing:
        metadata = ds.get("metadata") or {}
        if metadata.get("name") == wanted and desired is not None:
            seen = True
            current.append(ds)
            deleting = metadata.get("deletionTimestamp")
            if not deleting and objects.observed_hash(ds) != objects.observed_hash(desired):
                to_apply.append(desired)
        elif not metadata.get("deletionTimestamp"):
            to_delete.append(metadata["name"])
    if desired is not None and not seen:
        to_apply.append(desired)
    return PluginPlan(
        desired=desired, to_apply=to_apply, to_delete=sorted(to_delete), current=current
    )


def matching_nodes(module: modules.Module, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Nodes the device-plugin DaemonSet selects."""
    selector = devicepluginbuilders.node_selector(module)
    return sorted(
        (node.get("metadata") or {})["name"]
        for node in nodes
        if scheduling.matches_selector((node.get("metadata") or {}).get("labels"), selector)
    )


def ready_nodes(pods: Iterable[RawObject]) -> set[str]:
    """Nodes where a device-plugin pod of the Module is Ready."""
    return {
        pod["spec"]["nodeName"]
        for pod in pods
        if (pod.get("spec") or {}).get("nodeName") and moduleloader.is_pod_ready(pod)
    }
