"""The module loader's planner for one Module: which loader DaemonSets, where it is loaded.

Seed 000 steps 1-5, as a pure function of a ``views.ModuleView``: the
selector picks nodes (equality match), the kernel mapping turns their kernels
into (kernel, image) pairs, each pair wants one DaemonSet, found among the
existing ones by its labels (kernel, image hash); a pair's DaemonSet is sent
when missing or when its ``SPEC_HASH`` differs from the desired one;
DaemonSets of pairs that no longer exist (and duplicates of a pair) are deleted.

A selected node counts for a pair when the Module may schedule on it
(DESIGN §5 "schedulable"), or when a loader pod of the Module already runs
there: cordoning or tainting a node must not unload a module in use.

Ordered upgrades (``version`` set, seed 003): DaemonSets are per (kernel,
image, version) and run only on nodes whose ``version-module-loader`` label
names their version (``upgrade`` moves that label). A node is targeted when
it carries that label, and loaded when a loader pod of the Module of that
version and the node's kernel is Ready there. A node whose label was taken
away keeps ``.ready`` until its loader pod is gone, since the pod unloads the
module on its way out (``preStop``), and the upgrade's next step waits on it. A DaemonSet of another version
than the Module's is deleted once ``status.desiredNumberScheduled`` is 0, and
never before: nodes still run it.

Without a version, a targeted node is loaded when the loader pod of *its*
pair is Ready. Wanted labels: ``kernel-version.full`` on selected nodes
(shared by all Modules, never removed), ``.ready`` exactly where loaded.

Ready means Ready in the node's current boot (``views.ModuleView.ready``,
``kmm.operator.boots``): a reboot unloads the module, and until the kubelet
reports the container it starts again (its ``postStart`` loads the module
again), the pod's Ready condition is the earlier boot's. So ``.ready`` goes
once the Node shows a new boot id and comes back once this boot's loader is
Ready. The exception is a node whose version label was taken away (above):
its ``.ready`` stays until the old loader pod is gone, reboot or not, since
the kubelet may start that pod again (loading the old version) until its
deletion reaches the node.

A node that rebooted into another kernel belongs to that kernel's pair:
``kernel-version.full`` moves, the old kernel's DaemonSet no longer selects
the node and its controller deletes its pod there. Until then the kubelet
may start that pod again, and its ``postStart`` fails on a kernel its image
has no module for. Such pods are ``leaving``: what they fail at on that
node is not the Module's failure, and is never reported as one (nor as the
node's problem in ``kmm status`` and ``kmm upgrade``: ``inspecting``).

Pinned images (``pins``: kernel -> digest of an image kmm built, from the
build planner): the pair's DaemonSet runs ``image@digest``
(``builders.daemonset``), so an image built again under the same tag
changes its template. ``OnDelete`` keeps every running pod as it is; the
planner deletes (``replace``) only the pair's pods of another digest whose
containers are not ready, once the DaemonSet's template is the new one:
such a pod never loaded its module (``postStart`` failed: an unsigned
module refused by Secure Boot, a module that does not fit the kernel ...),
so nothing it holds is lost, and its successor runs the new image. A Ready
pod keeps the module it loaded until an ordered upgrade or a deletion of
its pod moves it (the node keeps ``.ready`` meanwhile), and so does one
whose node stopped reporting (``ContainersReady`` still True). Limit: a
loader container that crashed after it loaded (its module stays loaded:
no ``preStop`` runs on a crash) counts as one that never loaded.

Where the pod of a node's pair did not load, ``failed`` holds what its hook
reported (``reports``): the Module's ``ModuleLoadFailed``. Such a pod is not
Ready, so the node has no ``.ready``, whatever the kernel held before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from kmm.api import kernels, labels, scheduling
from kmm.operator import objects, plans, views
from kmm.operator.loader import builders as loader_builders
from kmm.operator.loader import reports as loader_reports

__all__ = ["LoaderPlan", "keep_old_version", "leaving", "plan"]

RawObject = dict[str, Any]
_ROLE = "module-loader"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = _meta(obj).get("labels") or {}
    return found


def _kernel_version(node: Mapping[str, Any]) -> str:
    value = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
    return value if isinstance(value, str) else ""


def _pair_of(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    found = _labels(obj)
    return (
        found.get(labels.KERNEL_VERSION_FULL, ""),
        found.get(labels.IMAGE_HASH, ""),
        found.get(labels.MODULE_VERSION, ""),
    )


def leaving(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``pod``, a loader pod on ``node``, is of another kernel than
    the one ``node`` reports (it rebooted into that one): it leaves the node,
    and what it fails at there is not the Module's (nor the node's)."""
    if _labels(pod).get(labels.ROLE) != _ROLE:
        return False
    kernel = _kernel_version(node)
    return bool(kernel) and _labels(pod).get(labels.KERNEL_VERSION_FULL) != labels.kernel_value(
        kernels.node_kernel(kernel)
    )


def keep_old_version(ds: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet of a version the Module no longer has must stay:
    until its controller reports no node left (``desiredNumberScheduled`` 0)."""
    return (ds.get("status") or {}).get("desiredNumberScheduled") != 0


@dataclasses.dataclass
class LoaderPlan(plans.Plan):
    """The loader's wants, and the facts the other planners and the status read.

    ``current`` are the loader DaemonSets kept (every version); ``targeted``
    the nodes that should have the module loaded, ``loaded`` those that have
    it; ``grouping`` maps kernels to targets (its ``errors`` make the Module
    Degraded).
    """

    grouping: kernels.Grouping = dataclasses.field(
        default_factory=lambda: kernels.Grouping({}, {}, [], {})
    )
    current: list[RawObject] = dataclasses.field(default_factory=list)
    targeted: set[str] = dataclasses.field(default_factory=set)
    loaded: set[str] = dataclasses.field(default_factory=set)
    # With a version: the version each loaded node runs.
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    # With a version: nodes whose loader label is gone and whose loader pod is
    # not yet (it unloads on its way out); they keep `.ready` meanwhile.
    unloading: set[str] = dataclasses.field(default_factory=set)
    # Loader pods of an older pinned image that never loaded: to delete.
    replace: list[RawObject] = dataclasses.field(default_factory=list)
    # Targeted nodes where the pod of their pair (and version) did not load,
    # and what its hook reported (``reports``): node -> report.
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    # Names of loader pods on a node that now runs another kernel than
    # theirs: leaving it, and what they fail at there is not the Module's.
    leaving: set[str] = dataclasses.field(default_factory=set)


def _candidates(
    view: views.ModuleView,
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Selected nodes' kernel labels, and the (node, kernelVersion) pairs that
    count: schedulable for the Module, or running one of its loader pods."""
    pods = view.pods.get(_ROLE, ())
    with_loader = {
        (pod.get("spec") or {}).get("nodeName")
        for pod in pods
        if not _meta(pod).get("deletionTimestamp")
    }
    kernel_labels: dict[str, str] = {}
    candidates: list[tuple[str, str]] = []
    for selected in view.selected:
        name = _meta(selected)["name"]
        kernel_version = _kernel_version(selected)
        if not kernel_version:
            continue
        kernel_labels[name] = labels.kernel_value(kernels.node_kernel(kernel_version))
        if name in with_loader or scheduling.is_schedulable(selected, view.module.spec.tolerations):
            candidates.append((name, kernel_version))
    return kernel_labels, candidates


def grouping(view: views.ModuleView) -> kernels.Grouping:
    """The kernels the loader targets and their targets (what ``plan`` groups by)."""
    if view.module.spec.module_loader is None:
        return kernels.Grouping({}, {}, [], {})
    return kernels.group_nodes(view.module, _candidates(view)[1])


def plan(
    view: views.ModuleView,
    *,
    gated: Collection[str] = frozenset(),
    pins: Mapping[str, str] | None = None,
) -> LoaderPlan:
    """``gated``: kernels whose image is not known to exist yet (``build``):
    no loader DaemonSet is created for them, and one that exists is kept as
    it is, never deleted because its image went missing. ``pins``: kernels
    whose image kmm built, and its digest."""
    module = view.module
    result = LoaderPlan()
    ready_key = labels.ready(view.namespace, view.name)
    existing = sorted(view.daemonsets.get(_ROLE, ()), key=lambda obj: _meta(obj)["name"])
    if module.spec.module_loader is None:
        result.delete = [
            _meta(ds)["name"] for ds in existing if not _meta(ds).get("deletionTimestamp")
        ]
        for node in view.nodes():
            result.want(node, ready_key, None)
        return result
    version = view.version
    loader_key = labels.module_loader_version(view.namespace, view.name)
    pods = view.pods.get(_ROLE, ())
    kernel_labels, candidates = _candidates(view)
    for name, value in kernel_labels.items():
        result.want(name, labels.KERNEL_VERSION_FULL, value)
    result.grouping = kernels.group_nodes(module, candidates)

    desired: dict[str, RawObject] = {}
    node_pairs: dict[str, tuple[str, str, str]] = {}
    waiting = {labels.kernel_value(kernel) for kernel in gated}
    pinned: dict[tuple[str, str, str], str] = {}  # pair -> digest label value
    for kernel, target in result.grouping.targets.items():
        digest = (pins or {}).get(kernel)
        ds = loader_builders.daemonset(module, target, digest=digest)
        if digest:
            pinned[_pair_of(ds)] = labels.image_digest_value(digest)
        if kernel not in gated:
            desired[_meta(ds)["name"]] = ds
        for node_name in result.grouping.nodes.get(kernel, ()):
            node_pairs[node_name] = _pair_of(ds)

    wanted_by_pair = {_pair_of(ds): name for name, ds in desired.items()}
    found_names: set[str] = set()
    for ds in existing:
        name, deleting = _meta(ds)["name"], _meta(ds).get("deletionTimestamp")
        ds_version = _labels(ds).get(labels.MODULE_VERSION)
        if _labels(ds).get(labels.KERNEL_VERSION_FULL) in waiting:
            result.current.append(ds)  # its kernel's image is being made: kept as is
        elif wanted_by_pair.get(_pair_of(ds)) == name:
            found_names.add(name)
            result.current.append(ds)
            if not deleting and objects.observed_hash(ds) != objects.observed_hash(desired[name]):
                result.apply.append(desired[name])
        elif version is not None and ds_version != version and keep_old_version(ds):
            result.current.append(ds)  # nodes still run this version
        elif not deleting:
            result.delete.append(name)  # its pair is gone, or a stray duplicate of a pair
    result.apply.extend(ds for name, ds in sorted(desired.items()) if name not in found_names)
    sent = {_meta(ds)["name"] for ds in result.apply}
    current = {_pair_of(desired[n]) for n in found_names if n not in sent}
    result.replace = [
        pod
        for pod in view.pods.get(_ROLE, ())
        if (pair := _pair_of(pod)) in pinned
        and pair in current
        and _labels(pod).get(labels.IMAGE_DIGEST) != pinned[pair]
        and not views.is_pod_ready(pod)
        # A pod that loaded and whose node stopped reporting still holds its module.
        and not views.containers_ready(pod)
        and not _meta(pod).get("deletionTimestamp")
    ]

    nodes = view.nodes()
    on_nodes = [(str((pod.get("spec") or {}).get("nodeName") or ""), pod) for pod in pods]
    # Ready in this boot of its node (``view.ready``): a pod Ready from an
    # earlier boot loaded a module the reboot unloaded.
    ready_pods = [(node, pod) for node, pod in on_nodes if view.ready(pod)]
    replaced = {id(pod) for pod in result.replace}
    # Reports of pods of the node's own pair (and version): an older
    # image's pod being replaced, or another kernel's leaving the node, is
    # not why the module did not load there.
    reported = [
        (node, pod, text)
        for node, pod in on_nodes
        if id(pod) not in replaced and (text := loader_reports.report(pod)) is not None
    ]
    result.leaving = {
        str(_meta(pod).get("name"))
        for pod in pods
        if (on := nodes.get(str((pod.get("spec") or {}).get("nodeName") or "")))
        and leaving(pod, on)
    }
    if version is None:
        result.targeted = set(node_pairs)
        result.loaded = {
            node
            for node, pod in ready_pods
            if node in node_pairs and _pair_of(pod) == node_pairs[node]
        }
        result.failed = {
            node: text
            for node, pod, text in reported
            if node in node_pairs and _pair_of(pod) == node_pairs[node]
        }
    else:
        # The version a node runs is the one its loader label names, which
        # may be an older one than the Module's (even one whose mapping the
        # Module no longer has) during an upgrade.
        running = {n: v for n in kernel_labels if (v := _labels(nodes[n]).get(loader_key))}

        def runs_there(node: str, pod: RawObject) -> bool:
            return (
                node in running
                and _labels(pod).get(labels.MODULE_VERSION) == running[node]
                and _labels(pod).get(labels.KERNEL_VERSION_FULL) == kernel_labels[node]
            )

        result.loaded = {node for node, pod in ready_pods if runs_there(node, pod)}
        result.failed = {node: text for node, pod, text in reported if runs_there(node, pod)}
        result.targeted = {n for n in node_pairs if n in running} | result.loaded
        result.versions = {n: running[n] for n in result.loaded}
        # Its loader label gone, a node is not unloaded until its loader pod
        # is gone too: that pod unloads in preStop, and `.ready` is what the
        # upgrade waits on before the next version's loader may start there
        # (seed 003: unload, then load). So `.ready` stays while it goes; it
        # is never added for a pod that did not load.
        result.unloading = {
            node
            for node in (str((pod.get("spec") or {}).get("nodeName") or "") for pod in pods)
            if node in nodes and node not in running and ready_key in _labels(nodes[node])
        }
    for node in nodes:
        keep = node in result.loaded or node in result.unloading
        result.want(node, ready_key, "" if keep else None)
    result.failed = {n: t for n, t in result.failed.items() if n not in result.loaded}
    return result
