"""What the cluster must look like, computed from its objects by the spec alone.

The churn's oracle (issue 16): given the objects of one moment (Modules,
Nodes, the DaemonSets and role-labelled pods of the Modules' namespace),
``expect`` says which DaemonSets must exist, which operator labels each node
must carry, where a Ready pod must run and what each Module's status must
say; ``differences`` lists every way the objects differ from that, ``[]``
when the cluster is right. It never calls the operator (``kmm.operator``):
a model that reused the planners would only agree with them.

Sources, for the churn's Modules (a ``moduleLoader`` each, no version, no DRA):

- seed 000 steps 1-6, DESIGN §5: the selector (equality) picks nodes; the
  kernel mapping turns a node's kernel into an image; one loader DaemonSet
  per (kernel, image) pair, owned by the Module, ``updateStrategy: OnDelete``,
  selecting the selector plus ``kernel-version.full``; none for a pair no
  node has, none of a deleted Module, never two for one pair;
- DESIGN §3, kernel mapping: ``nodeInfo.kernelVersion`` minus one trailing
  ``+``; mappings in order, first match wins; ``literal`` exact, ``regexp`` an
  unanchored search; image variables ``KERNEL_FULL_VERSION`` (unsafe
  characters as ``_``), ``KERNEL_XYZ``/``X``/``Y``/``Z`` (split on
  ``[.,-]``), ``MOD_NAME``, ``MOD_NAMESPACE``, as ``${V}`` or ``$V``;
- DESIGN §5, schedulable: not cordoned and every NoSchedule/NoExecute taint
  tolerated. A selected node counts for a pair when the Module may schedule
  on it or a loader pod of the Module already runs there (cordoning or
  tainting must not unload a module in use; ``kmm.operator.loader.planner``'s
  stated rule, the one place the spec leaves it open);
- DESIGN §4: ``<ns>.<name>.ready`` exactly where the loader pod of the node's
  pair is Ready; ``device-plugin-ready`` where the Module's device-plugin pod
  is Ready, on nodes where the module is loaded; ``kernel-version.full`` =
  the node's kernel on every node a Module selects (a node no Module
  selects may keep it, but never with another kernel: the label exists so
  DaemonSets can select on it, and a stale one puts a wrong loader on the
  node the moment a selector takes it in); no other label under the
  operator's prefixes;
- the device-plugin DaemonSet: one per Module with ``devicePlugin``,
  selecting ``<ns>.<name>.ready``;
- status (DESIGN §3, KMM's counts): ``nodesMatchingSelectorNumber`` the nodes
  the DaemonSets start from (selected nodes; for the plugin, the loaded ones),
  ``desiredNumber``/``availableNumber`` the nodes where the DaemonSet
  controller runs a pod / where it is available; ``observedGeneration`` the
  Module's generation; Ready when nodes are targeted and all loaded (plugin
  Ready wherever it should run), Degraded False, not Progressing.

Kubernetes facts: a DaemonSet should run a pod on a node its node selector
matches whose NoSchedule/NoExecute taints its pods tolerate, counting the
tolerations the controller adds to every daemon pod (cordoned nodes
included); pods keep running under a NoSchedule taint that comes later.

Borrowed from kmm: ``kmm.api.labels`` (names and the label-value encoding
of kernels and images; DESIGN §4 makes that module the one owner of every
name) and ``kmm.kube.objects`` (reading a raw object's name and labels).
Kernel matching and image expansion are recomputed here, the
regexps with Python's ``re``, which agrees with Go's RE2 on the churn's
patterns (anchors, ``\\d``, escapes, classes).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from kmm.api import labels
from kmm.kube import objects

__all__ = ["Expected", "Snapshot", "Wanted", "differences", "expect", "is_ready"]

Obj = dict[str, Any]

# What the DaemonSet controller adds to every daemon pod (k8s.io/kubernetes
# pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations; no hostNetwork).
_DAEMON_TOLERATIONS: Final = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_BLOCKING: Final = frozenset({"NoSchedule", "NoExecute"})
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The objects of one moment: every Module, Node, DaemonSet of the
    Modules' namespace and pod there with the role label (raw, camelCase)."""

    namespace: str
    modules: Sequence[Obj]
    nodes: Sequence[Obj]
    daemonsets: Sequence[Obj]
    pods: Sequence[Obj]


@dataclasses.dataclass(frozen=True)
class Wanted:
    """One DaemonSet that must exist: found by ``identity`` (its labels)."""

    module: str
    identity: Mapping[str, str]
    image: str
    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, str]]
    owner_uid: str
    on_delete: bool

    def describe(self) -> str:
        return f"{self.module} {self.identity[labels.ROLE]} {self.image}"


@dataclasses.dataclass
class Expected:
    daemonsets: list[Wanted] = dataclasses.field(default_factory=list)
    # node -> operator label -> value it must have / may have.
    labels: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    allowed: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # node -> identities of the Ready pods that must run there.
    pods: dict[str, list[Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    # Module name -> the status fields it must show.
    statuses: dict[str, Obj] = dataclasses.field(default_factory=dict)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


_labels = objects.labels
_name = objects.name


def _live(obj: Mapping[str, Any]) -> bool:
    return not _meta(obj).get("deletionTimestamp")


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return _live(pod) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


# -- kernels and images (DESIGN §3) -------------------------------------


def node_kernel(node: Mapping[str, Any]) -> str:
    found = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion") or ""
    return str(found).removesuffix("+")


def _mapping(mappings: Iterable[Mapping[str, Any]], kernel: str) -> Mapping[str, Any] | None:
    for mapping in mappings:
        if "literal" in mapping and mapping["literal"] == kernel:
            return mapping
        if "regexp" in mapping and re.search(mapping["regexp"], kernel):
            return mapping
    return None


def _image(template: str, kernel: str, namespace: str, name: str) -> str:
    x, y, z = re.split(r"[.,-]", kernel)[:3]
    values = {
        "KERNEL_FULL_VERSION": re.sub(r"[^A-Za-z0-9._-]", "_", kernel),
        "KERNEL_XYZ": f"{x}.{y}.{z}",
        "KERNEL_X": x,
        "KERNEL_Y": y,
        "KERNEL_Z": z,
        "MOD_NAME": name,
        "MOD_NAMESPACE": namespace,
    }
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], template)


# -- scheduling (DESIGN §5, and the DaemonSet controller) ---------------


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")


def _taints_tolerated(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return all(
        any(_tolerates(t, taint) for t in tolerations)
        for taint in (node.get("spec") or {}).get("taints") or ()
        if taint.get("effect") in _BLOCKING
    )


def _schedulable(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return not (node.get("spec") or {}).get("unschedulable") and _taints_tolerated(
        node, tolerations
    )


def _daemon_runs(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return _taints_tolerated(node, [*tolerations, *_DAEMON_TOLERATIONS])


def _selects(selector: Mapping[str, str], node: Mapping[str, Any]) -> bool:
    found = _labels(node)
    return all(found.get(k) == v for k, v in selector.items())


# -- the model -----------------------------------------------------------


def _module_labels(namespace: str, name: str, role: str) -> dict[str, str]:
    return {labels.MODULE_NAME: name, labels.MODULE_NAMESPACE: namespace, labels.ROLE: role}


def _pods_on(pods: Sequence[Obj], node: str, identity: Mapping[str, str]) -> list[Obj]:
    return [
        p
        for p in pods
        if (p.get("spec") or {}).get("nodeName") == node
        and all(_labels(p).get(k) == v for k, v in identity.items())
    ]


def _expect_module(module: Obj, snapshot: Snapshot, into: Expected) -> None:
    namespace, name = snapshot.namespace, _name(module)
    spec = module["spec"]
    selector: Mapping[str, str] = spec.get("selector") or {}
    tolerations: list[Mapping[str, str]] = list(spec.get("tolerations") or ())
    container = spec["moduleLoader"]["container"]
    uid = str(_meta(module).get("uid"))
    live = [p for p in snapshot.pods if _live(p)]
    own = _module_labels(namespace, name, "module-loader")

    selected = [n for n in snapshot.nodes if _selects(selector, n) and node_kernel(n)]
    pairs: dict[str, tuple[str, str]] = {}  # node -> (kernel, image)
    for node in selected:
        kernel = node_kernel(node)
        into.labels[_name(node)][labels.KERNEL_VERSION_FULL] = labels.kernel_value(kernel)
        runs_here = bool(_pods_on(live, _name(node), own))
        if not (runs_here or _schedulable(node, tolerations)):
            continue
        mapping = _mapping(container["kernelMappings"], kernel)
        if mapping is not None:
            template = mapping.get("containerImage") or container["containerImage"]
            pairs[_name(node)] = (kernel, _image(template, kernel, namespace, name))

    identities: dict[tuple[str, str], dict[str, str]] = {}
    for kernel, image in sorted(set(pairs.values())):
        identity = {
            **own,
            labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel),
            labels.IMAGE_HASH: labels.image_hash(image),
        }
        identities[kernel, image] = identity
        node_selector = {**selector, labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel)}
        into.daemonsets.append(
            Wanted(name, identity, image, node_selector, tolerations, uid, on_delete=True)
        )

    ready_key = labels.ready(namespace, name)
    loaded: set[str] = set()
    loader_runs: set[str] = set()
    kernels_served = {kernel for kernel, _ in identities}
    for node in selected:
        node_name, kernel = _name(node), node_kernel(node)
        if node_name in pairs:
            identity = identities[pairs[node_name]]
            if any(is_ready(p) for p in _pods_on(live, node_name, identity)):
                loaded.add(node_name)
                into.labels[node_name][ready_key] = ""
        # Where the DaemonSet of the node's kernel runs a pod (a node counted
        # out above, with no pod and an untolerated taint, gets none either).
        if kernel in kernels_served and _daemon_runs(node, tolerations):
            mapped = _mapping(container["kernelMappings"], kernel)
            template = (mapped or {}).get("containerImage") or container["containerImage"]
            pair = (kernel, _image(template, kernel, namespace, name))
            if pair in identities:
                loader_runs.add(node_name)
                into.pods[node_name].append(identities[pair])

    status: Obj = {
        "observedGeneration": _meta(module).get("generation"),
        "moduleLoader": {
            "nodesMatchingSelectorNumber": sum(_selects(selector, n) for n in snapshot.nodes),
            "desiredNumber": len(loader_runs),
            "availableNumber": len(loader_runs),
        },
    }
    plugin_ok = True
    if spec.get("devicePlugin"):
        plugin = _module_labels(namespace, name, "device-plugin")
        into.daemonsets.append(
            Wanted(
                name,
                plugin,
                spec["devicePlugin"]["container"]["image"],
                {ready_key: ""},
                tolerations,
                uid,
                on_delete=False,
            )
        )
        plugin_runs = {
            _name(n) for n in selected if _name(n) in loaded and _daemon_runs(n, tolerations)
        }
        plugin_key = labels.device_plugin_ready(namespace, name)
        for node_name in sorted(loaded):
            if any(is_ready(p) for p in _pods_on(live, node_name, plugin)):
                into.labels[node_name][plugin_key] = ""
            elif node_name in plugin_runs:
                plugin_ok = False
        for node_name in plugin_runs:
            into.pods[node_name].append(plugin)
        status["devicePlugin"] = {
            "nodesMatchingSelectorNumber": len(loaded),
            "desiredNumber": len(plugin_runs),
            "availableNumber": len(plugin_runs),
        }
    ready = bool(pairs) and loaded == set(pairs) and plugin_ok
    status["conditions"] = {
        "Ready": "True" if ready else "False",
        "Progressing": "False",
        "Degraded": "False",
    }
    into.statuses[name] = status


def expect(snapshot: Snapshot) -> Expected:
    """What the cluster must be for ``snapshot``'s Modules and Nodes (and,
    where the spec makes it depend on them, its pods)."""
    found = Expected()
    for node in snapshot.nodes:
        found.labels[_name(node)] = {}
        found.pods[_name(node)] = []
        kernel = node_kernel(node)
        found.allowed[_name(node)] = (
            {labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel)} if kernel else {}
        )
    for module in sorted(snapshot.modules, key=_name):
        if _live(module):
            _expect_module(module, snapshot, found)
    return found


# -- comparing -------------------------------------------------------------


def _operator_labels(node: Mapping[str, Any]) -> dict[str, str]:
    return {
        k: v
        for k, v in _labels(node).items()
        if k.startswith(labels.PREFIX) or k.startswith(labels.BETA_PREFIX)
    }


def _daemonset_problems(wanted: Wanted, ds: Mapping[str, Any]) -> list[str]:
    problems = []
    template = ds["spec"]["template"]["spec"]
    if [c.get("image") for c in template.get("containers") or ()][:1] != [wanted.image]:
        problems.append(f"image {template['containers'][0].get('image')}")
    if dict(template.get("nodeSelector") or {}) != dict(wanted.node_selector):
        problems.append(f"nodeSelector {template.get('nodeSelector')}")
    have = [
        {k: v for k, v in t.items() if v is not None} for t in template.get("tolerations") or ()
    ]
    if have != [dict(t) for t in wanted.tolerations]:
        problems.append(f"tolerations {have}")
    owners = [r for r in _meta(ds).get("ownerReferences") or () if r.get("controller")]
    if [r.get("uid") for r in owners] != [wanted.owner_uid]:
        problems.append(f"controller {owners}")
    strategy = (ds["spec"].get("updateStrategy") or {}).get("type")
    if wanted.on_delete and strategy != "OnDelete":
        problems.append(f"updateStrategy {strategy}")
    return problems


def differences(snapshot: Snapshot, expected: Expected) -> list[tuple[str, str]]:
    """Every way ``snapshot`` differs from ``expected``, as (node name or
    "", what); empty when the cluster is right."""
    found: list[tuple[str, str]] = []
    owned = [d for d in snapshot.daemonsets if labels.ROLE in _labels(d)]
    matched: set[str] = set()
    for wanted in expected.daemonsets:
        same = [d for d in owned if all(_labels(d).get(k) == v for k, v in wanted.identity.items())]
        matched.update(_name(d) for d in same)
        if len(same) != 1:
            names = [_name(d) for d in same]
            found.append(("", f"{len(same)} DaemonSets {names} for {wanted.describe()}"))
            continue
        if not _live(same[0]):
            found.append(("", f"DaemonSet {_name(same[0])} still terminating"))
        for problem in _daemonset_problems(wanted, same[0]):
            found.append(("", f"DaemonSet {_name(same[0])} ({wanted.describe()}): {problem}"))
    for ds in owned:
        if _name(ds) not in matched:
            found.append(("", f"orphan DaemonSet {_name(ds)} {dict(_labels(ds))}"))

    identities = [w.identity for w in expected.daemonsets]
    existing = {_name(n) for n in snapshot.nodes}
    for pod in snapshot.pods:
        node = (pod.get("spec") or {}).get("nodeName") or ""
        known = any(all(_labels(pod).get(k) == v for k, v in i.items()) for i in identities)
        if node in existing and _live(pod) and not known:
            found.append((node, f"orphan pod {_name(pod)} {dict(_labels(pod))}"))

    for node in snapshot.nodes:
        node_name = _name(node)
        have = _operator_labels(node)
        want = expected.labels[node_name]
        allowed = expected.allowed[node_name]
        for key in sorted({*have, *want}):
            if key in want and have.get(key) != want[key]:
                found.append((node_name, f"label {key}={have.get(key)!r}, want {want[key]!r}"))
            elif key not in want and not (key in allowed and have[key] == allowed[key]):
                found.append((node_name, f"stale label {key}={have[key]!r}"))
        for identity in expected.pods[node_name]:
            running = [p for p in _pods_on(snapshot.pods, node_name, identity) if _live(p)]
            if len(running) != 1 or not is_ready(running[0]):
                found.append((node_name, f"{len(running)} pods of {dict(identity)}, want 1 Ready"))

    for module in snapshot.modules:
        name = _name(module)
        if not _live(module):
            found.append(("", f"Module {name} still terminating"))
            continue
        status = module.get("status") or {}
        want_status = expected.statuses[name]
        have_status: Obj = {
            "observedGeneration": status.get("observedGeneration"),
            "conditions": {c["type"]: c["status"] for c in status.get("conditions") or ()},
        }
        for part in ("moduleLoader", "devicePlugin"):
            if part in want_status or status.get(part):
                have_status[part] = {
                    k: v for k, v in (status.get(part) or {}).items() if k != "versions"
                }
        if have_status != want_status:
            found.append(("", f"Module {name} status {have_status}, want {want_status}"))
    return found
