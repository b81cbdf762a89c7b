"""The device plugin's planner for one Module (pure).

One device-plugin DaemonSet per Module with ``spec.devicePlugin`` (one per
version with ordered upgrades), kept by ``workloads.sync_daemonsets``:
deleted when ``devicePlugin`` is removed, a DaemonSet of an older version
kept while nodes still run it. The node label
``<ns>.<name>.device-plugin-ready`` follows the readiness of the plugin pod
on that node.

The plugin is wanted where the module is loaded (and, with a version, where
the upgrade planner has put the device-plugin version label), or on every
selected node for an in-tree driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmm.api import labels
from kmm.operator import views, workloads
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.loader import planner as loader_planner

__all__ = ["PluginPlan", "plan"]

RawObject = dict[str, Any]
_ROLE = "device-plugin"

# The device plugin's answer is the shared workload shape.
PluginPlan = workloads.WorkloadPlan


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return found


def plan(view: views.ModuleView, loader: loader_planner.LoaderPlan) -> PluginPlan:
    module = view.module
    result = PluginPlan(enabled=module.spec.device_plugin is not None, noun="device-plugin")
    desired = deviceplugin_builders.daemonset(module) if result.enabled else None
    workloads.sync_daemonsets(result, view.daemonsets.get(_ROLE, ()), desired, view.version)

    nodes = view.nodes()
    if result.enabled:
        result.ready = workloads.ready_nodes(view, view.pods.get(_ROLE, ()))
        if module.spec.module_loader is None:
            result.eligible = view.selected_names()
        else:
            result.eligible = set(loader.loaded)
        if view.version is None:
            result.wanted = set(result.eligible)
        else:
            gate = labels.device_plugin_version(view.namespace, view.name)
            result.wanted = {n for n in result.eligible if _labels(nodes[n]).get(gate)}
    ready_key = labels.device_plugin_ready(view.namespace, view.name)
    for node in nodes:
        result.want(node, ready_key, "" if node in result.ready else None)
    return result
