"""The device plugin's planner for one Module (pure).

One device-plugin DaemonSet per Module with ``spec.devicePlugin`` (one per
version with ordered upgrades), sent when missing or when its ``SPEC_HASH``
differs, deleted when ``devicePlugin`` is removed; a DaemonSet of an older
version stays while nodes still run it (``moduleloader.keep_old_version``).
The node label ``<ns>.<name>.device-plugin-ready`` follows the readiness of
the plugin pod on that node.

The plugin is wanted where the module is loaded (and, with a version, where
the upgrade planner has put the device-plugin version label), or on every
selected node for an in-tree driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kmm.api import labels
from kmm.operator import devicepluginbuilders, moduleloader, objects, plans, views

__all__ = ["PluginPlan", "plan"]

RawObject = dict[str, Any]
_ROLE = "device-plugin"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


@dataclasses.dataclass
class PluginPlan(plans.Plan):
    """``current``: the plugin DaemonSets kept; ``wanted``: nodes where a plugin
    should run; ``ready``: nodes where one is Ready. ``enabled`` is False for a
    Module without ``devicePlugin``."""

    enabled: bool = False
    current: list[RawObject] = dataclasses.field(default_factory=list)
    wanted: set[str] = dataclasses.field(default_factory=set)
    ready: set[str] = dataclasses.field(default_factory=set)


def plan(view: views.ModuleView, loader: moduleloader.LoaderPlan) -> PluginPlan:
    module = view.module
    result = PluginPlan(enabled=module.spec.device_plugin is not None)
    ready_key = labels.device_plugin_ready(view.namespace, view.name)
    existing = sorted(view.daemonsets.get(_ROLE, ()), key=lambda obj: _meta(obj)["name"])
    desired = devicepluginbuilders.daemonset(module) if result.enabled else None
    wanted_name = _meta(desired)["name"] if desired is not None else None
    version = view.version
    seen = False
    for ds in existing:
        name, deleting = _meta(ds)["name"], _meta(ds).get("deletionTimestamp")
        ds_version = (_meta(ds).get("labels") or {}).get(labels.MODULE_VERSION)
        if desired is not None and name == wanted_name:
            seen = True
            result.current.append(ds)
            if not deleting and objects.observed_hash(ds) != objects.observed_hash(desired):
                result.apply.append(desired)
        elif (
            result.enabled
            and version is not None
            and ds_version != version
            and moduleloader.keep_old_version(ds)
        ):
            result.current.append(ds)
        elif not deleting:
            result.delete.append(name)
    if desired is not None and not seen:
        result.apply.append(desired)

    nodes = view.nodes()
    if result.enabled:
        result.ready = {
            node
            for pod in view.pods.get(_ROLE, ())
            if (node := (pod.get("spec") or {}).get("nodeName")) and views.is_pod_ready(pod)
        }
        if module.spec.module_loader is None:
            result.wanted = view.selected_names()
        elif version is None:
            result.wanted = set(loader.loaded)
        else:
            gate = labels.device_plugin_version(view.namespace, view.name)
            result.wanted = {
                n for n in loader.loaded if (_meta(nodes[n]).get("labels") or {}).get(gate)
            }
    for node in nodes:
        result.want(node, ready_key, "" if node in result.ready else None)
    return result
