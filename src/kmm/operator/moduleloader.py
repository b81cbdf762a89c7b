"""The module loader's plan for one Module: which loader DaemonSets, where it is ready.

Seed 000 steps 1-5, as a pure function of the cache: the selector picks nodes
(equality match), the kernel mapping turns their kernels into (kernel, image)
pairs, each pair wants one DaemonSet, found among the existing ones by its
labels (kernel, image hash); a pair's DaemonSet is sent when missing or when
its ``SPEC_HASH`` differs from the desired one; DaemonSets of pairs that no
longer exist (and duplicates of a pair) are deleted.

A selected node counts for a pair when the Module may schedule on it
(DESIGN §5 "schedulable"), or when a loader pod of the Module already runs
there: cordoning or tainting a node must not unload a module in use.

Readiness: a targeted node is ready when the loader pod of *its* pair on it
is Ready; ``reconciler`` keeps the ``.ready`` label true to that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kmm.api import kernels, labels, modules, scheduling
from kmm.operator import loaderbuilders, objects

__all__ = ["LoaderPlan", "is_pod_ready", "plan", "ready_nodes", "selected_nodes"]

RawObject = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _kernel_version(node: Mapping[str, Any]) -> str:
    value = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
    return value if isinstance(value, str) else ""


def selected_nodes(module: modules.Module, nodes: Iterable[RawObject]) -> list[RawObject]:
    """Nodes whose labels match ``spec.selector``, by name."""
    found = [
        node
        for node in nodes
        if scheduling.matches_selector(_meta(node).get("labels"), module.spec.selector)
    ]
    return sorted(found, key=lambda node: _meta(node)["name"])


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    """What the loader part of a reconcile must make true.

    ``kernel_labels`` maps every selected node that reports a kernel to its
    ``kernel-version.full`` value; ``node_pairs`` maps targeted nodes to the
    pair labels (kernel value, image hash) their loader pod must carry.
    """

    selected: list[str]
    grouping: kernels.Grouping
    desired: dict[str, RawObject]
    to_apply: list[RawObject]
    to_delete: list[str]
    current: list[RawObject]
    kernel_labels: dict[str, str]
    node_pairs: dict[str, tuple[str, str]]


def _pair_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    found = _meta(obj).get("labels") or {}
    return (found.get(labels.KERNEL_VERSION_FULL, ""), found.get(labels.IMAGE_HASH, ""))


def plan(
    module: modules.Module,
    nodes: Iterable[RawObject],
    existing: Iterable[RawObject],
    pods: Iterable[RawObject],
) -> LoaderPlan:
    """The loader plan; ``existing`` and ``pods`` are the Module's loader DaemonSets and pods."""
    selected = selected_nodes(module, nodes)
    with_loader = {
        pod.get("spec", {}).get("nodeName")
        for pod in pods
        if not _meta(pod).get("deletionTimestamp")
    }
    kernel_labels: dict[str, str] = {}
    candidates: list[tuple[str, str]] = []
    for node in selected:
        name = _meta(node)["name"]
        version = _kernel_version(node)
        if not version:
            continue
        kernel_labels[name] = labels.kernel_value(kernels.node_kernel(version))
        if name in with_loader or scheduling.is_schedulable(node, module.spec.tolerations):
            candidates.append((name, version))
    grouping = kernels.group_nodes(module, candidates)

    desired: dict[str, RawObject] = {}
    node_pairs: dict[str, tuple[str, str]] = {}
    for kernel, target in grouping.targets.items():
        ds = loaderbuilders.daemonset(module, target)
        desired[ds["metadata"]["name"]] = ds
        pair = (labels.kernel_value(kernel), labels.image_hash(target.image))
        for node_name in grouping.nodes.get(kernel, ()):
            node_pairs[node_name] = pair

    wanted_by_pair = {_pair_of(ds): name for name, ds in desired.items()}
    to_apply: list[RawObject] = []
    to_delete: list[str] = []
    current: list[RawObject] = []
    found_names: set[str] = set()
    for ds in sorted(existing, key=lambda obj: _meta(obj)["name"]):
        name = _meta(ds)["name"]
        if wanted_by_pair.get(_pair_of(ds)) == name:
            found_names.add(name)
            current.append(ds)
            if not _meta(ds).get("deletionTimestamp") and objects.observed_hash(
                ds
            ) != objects.observed_hash(desired[name]):
                to_apply.append(desired[name])
        elif not _meta(ds).get("deletionTimestamp"):
            to_delete.append(name)  # its pair is gone, or a stray duplicate of a pair
    to_apply.extend(ds for name, ds in sorted(desired.items()) if name not in found_names)
    return LoaderPlan(
        selected=[_meta(node)["name"] for node in selected],
        grouping=grouping,
        desired=desired,
        to_apply=to_apply,
        to_delete=to_delete,
        current=current,
        kernel_labels=kernel_labels,
        node_pairs=node_pairs,
    )


def ready_nodes(node_pairs: Mapping[str, tuple[str, str]], pods: Iterable[RawObject]) -> set[str]:
    """Targeted nodes whose loader pod for the node's own pair is Ready."""
    ready: set[str] = set()
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if (
            isinstance(node, str)
            and node in node_pairs
            and is_pod_ready(pod)
            and _pair_of(pod) == node_pairs[node]
        ):
            ready.add(node)
    return ready
