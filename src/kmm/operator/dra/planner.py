"""The DRA planner for one Module (pure): seed 000 "DRA", points 1-4.

For a Module with ``spec.dra`` it wants:

- the DRA driver DaemonSet (``dra.builders``; one per version with ordered
  upgrades, kept by ``workloads.sync_daemonsets``, so an old version's goes
  once no node runs it);
- ``.dra-target`` on every selected node the Module may schedule on (DESIGN
  §5), and off a selected node that is not schedulable any more, so a drain
  evicts the driver. Refinement: while a ResourceClaim allocated with a
  device of the Module's driver on that node is reserved for a pod, the
  label stays, so the driver outlives the pods whose claims the kubelet must
  still unprepare. A node the selector no longer picks is left as it is;
- ``.dra-ready`` where the driver pod is Ready;
- the DeviceClasses of ``spec.dra.deviceClasses``, created when missing and
  updated when their ``SPEC_HASH`` differs; the Module's classes no longer
  listed are deleted. A class is the Module's by its labels *with the
  Module's uid* (``ownership.class_owned``; one without any uid label, from a
  kmm before uids, is updated when listed, which stamps it, and never
  deleted). A listed name taken by a class that is not the Module's is a
  conflict: reported, never overwritten.

Without ``spec.dra`` every one of these goes: the DaemonSets, the Module's
DeviceClasses, the target and ready labels (on every node carrying them).

A claim is "on" a node when its allocation's node selector matches the node
(the scheduler writes one for node-local devices); a claim without one
(network-attached devices) holds no node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kmm.api import labels, scheduling
from kmm.operator import objects, ownership, views, workloads
from kmm.operator.dra import builders as dra_builders
from kmm.operator.loader import planner as loader_planner

__all__ = ["DraPlan", "claim_nodes", "holds", "plan"]

RawObject = dict[str, Any]
_ROLE = "dra"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = _meta(obj).get("labels") or {}
    return found


@dataclasses.dataclass
class DraPlan(workloads.WorkloadPlan):
    """The DRA part's wants beyond a workload's: DeviceClasses to send or
    delete, names taken by someone else's class (with why), and per node the
    claims keeping its target label although it is unschedulable."""

    classes_apply: list[RawObject] = dataclasses.field(default_factory=list)
    classes_delete: list[str] = dataclasses.field(default_factory=list)
    conflicts: dict[str, str] = dataclasses.field(default_factory=dict)
    held: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def claim_nodes(claim: Mapping[str, Any], driver: str) -> Mapping[str, Any] | None:
    """The allocation's node selector when ``claim`` holds a device of ``driver``
    and is reserved for some pod; None otherwise."""
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    if not status.get("reservedFor") or not any(r.get("driver") == driver for r in results):
        return None
    selector: Mapping[str, Any] | None = allocation.get("nodeSelector")
    return selector


def holds(claim: Mapping[str, Any], driver: str, node: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is reserved for a pod with a device of ``driver`` on ``node``."""
    selector = claim_nodes(claim, driver)
    return selector is not None and scheduling.matches_node_selector(node, selector)


def _holder(observed: Mapping[str, Any], view: views.ModuleView) -> str:
    """Whose a listed DeviceClass that is not the Module's is, as a message says it."""
    found = _labels(observed)
    namespace, name = found.get(labels.MODULE_NAMESPACE), found.get(labels.MODULE_NAME)
    if not (namespace and name):
        return "someone else (not kmm)"
    if (namespace, name) == (view.namespace, view.name):
        uid = found.get(labels.MODULE_UID)
        # An earlier Module of this name (its finalizer removed by hand), or
        # someone's labelling: never this one's to take or delete.
        return (
            f"another Module {namespace}/{name} (uid {uid}), not this one; "
            "delete it if that Module is gone"
        )
    return f"Module {namespace}/{name}"


def _classes(view: views.ModuleView, result: DraPlan) -> None:
    ns, name, uid = view.namespace, view.name, view.module.metadata.uid
    dra = view.module.spec.dra
    desired = (
        {c.name: dra_builders.device_class(view.module, c) for c in dra.device_classes or ()}
        if dra is not None
        else {}
    )
    for class_name, cached in sorted(view.device_classes.items()):
        if (
            class_name not in desired
            and ownership.class_owned(cached, namespace=ns, name=name, uid=uid)
            and not _meta(cached).get("deletionTimestamp")
        ):
            result.classes_delete.append(class_name)
    for class_name, wanted in sorted(desired.items()):
        observed = view.device_classes.get(class_name)
        if observed is None:
            result.classes_apply.append(wanted)
        elif not (
            ownership.class_owned(observed, namespace=ns, name=name, uid=uid)
            or ownership.class_adoptable(observed, namespace=ns, name=name)
        ):
            result.conflicts[class_name] = (
                f"DeviceClass {class_name} exists and belongs to {_holder(observed, view)}"
            )
        elif not _meta(observed).get("deletionTimestamp") and objects.observed_hash(
            observed
        ) != objects.observed_hash(wanted):
            result.classes_apply.append(wanted)


def plan(view: views.ModuleView, loader: loader_planner.LoaderPlan) -> DraPlan:
    module = view.module
    dra = module.spec.dra
    result = DraPlan(enabled=dra is not None, noun="DRA driver")
    desired = dra_builders.daemonset(module) if dra is not None else None
    workloads.sync_daemonsets(result, view.daemonsets.get(_ROLE, ()), desired, view.version)
    if view.resource_api:
        _classes(view, result)

    ns, name = view.namespace, view.name
    target_key, ready_key = labels.dra_target(ns, name), labels.dra_ready(ns, name)
    nodes = view.nodes()
    pods = view.pods.get(_ROLE, ())
    result.ready = workloads.ready_nodes(view, pods) if dra is not None else set()
    targets: set[str] = set()
    if dra is not None:
        with_pod = {
            (pod.get("spec") or {}).get("nodeName")
            for pod in pods
            if not _meta(pod).get("deletionTimestamp")
        }
        tolerations = module.spec.tolerations
        selected = view.selected_names()
        for node_name, node in nodes.items():
            if node_name not in selected:
                if target_key in _labels(node):
                    targets.add(node_name)  # not visited: keeps its label
                continue
            if scheduling.is_schedulable(node, tolerations):
                targets.add(node_name)
                result.want(node_name, target_key, "")
                continue
            holding = sorted(
                f"{_meta(c).get('namespace')}/{_meta(c).get('name')}"
                for c in view.claims
                if holds(c, dra.driver_name, node)
            )
            if holding and target_key in _labels(node):
                targets.add(node_name)
                result.held[node_name] = holding
            else:
                result.want(node_name, target_key, None)
        if module.spec.module_loader is None:
            result.eligible = {
                n
                for n in selected
                if n in with_pod or scheduling.is_schedulable(nodes[n], tolerations)
            }
        else:
            result.eligible = set(loader.loaded) & targets
        if view.version is None:
            result.wanted = set(result.eligible)
        else:
            gate = labels.device_plugin_version(ns, name)
            result.wanted = {n for n in result.eligible if _labels(nodes[n]).get(gate)}
    else:
        for node_name in nodes:
            result.want(node_name, target_key, None)
    for node_name in nodes:
        result.want(node_name, ready_key, "" if node_name in result.ready else None)
    return result
