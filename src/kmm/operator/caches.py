"""What the operator caches, and how each cached object maps back to Modules.

Four informers (DESIGN §5, seed 000 step 7): Modules, the DaemonSets and pods
kmm made (label ``role`` present), and Nodes; two more when the cluster
serves resource.k8s.io/v1 (seed 000 "DRA" point 5): every DeviceClass (a
name a Module lists may be taken by someone else's) and every ResourceClaim
(the API cannot filter claims by driver). Each keeps only the fields the
reconciler reads (``stores.keep_fields``), so 5,000 Nodes cost a few MiB.
DaemonSets and pods keep, of their ``ownerReferences``, only the uid of
their controller (``CONTROLLER_UID``, a field of the projection's own:
``controller_uid`` reads it); preflight pods keep their references whole.
Nodes keep their taints without ``timeAdded``, the pods of DaemonSets their
conditions without times (``project_node``, ``project_pod``): only key,
value and effect decide scheduling, only type and status readiness, and a
time per object would keep thousands of otherwise equal lists apart (equal
values are stored once). Nodes keep, of their annotations, only whether
KWOK manages them (``FAKE_NODE``, ``fake_node``): such a node runs no
container, so no pull pod goes there (``kmm.operator.build.pulling``).
Loader pods keep, of their container statuses, only the termination
messages (``LOADER_STATUS_FIELDS``, in the shape of the whole status): a
failed hook's report of why the module did not load
(``kmm.operator.loader.reports``); a loaded module's pod has none, so
thousands of them keep nothing more.

Boots (``kmm.operator.boots``): a Node's projection carries its
``status.nodeInfo.bootID`` as ``BOOT_ID`` in its metadata (``boot_id``),
and the pod of a Module's DaemonSet the start of its running container
(``state.running.startedAt``) as ``STARTED`` (``started``): a reboot shows
as a new boot id, the kubelet's restart of a container as a new start.
Both go in the metadata, which is per object anyway: in ``status`` they
would keep apart the kernel (Nodes) and the conditions (pods) that equal
objects now share. Neither is interned: each is unique to its object, and
the interpreter's table of interned strings would only grow. KWOK's nodes
report an empty boot id, which is not kept.

Which cached objects count as a Module's is ``ownership``'s to say: the
labels these indexes read are anyone's to write, so they only say where to
look.

Indexes answer the reconciler's questions without scans:

- DaemonSets and pods by ``MODULE_INDEX``: ``<ns>/<name>`` from their
  labels, only when the ``module.namespace`` label is the object's own
  namespace (an object elsewhere names no Module); preflight pods are left
  out, and indexed by ``PREFLIGHT_INDEX`` instead (the ``labels.PREFLIGHT``
  value);
- Nodes by ``MODULE_INDEX`` too, from the per-module labels they carry
  (``<ns>.<name>.ready``, the version labels ...; parsed by
  ``kmm.api.labels.module_of_node_label``), so a Module finds the nodes it
  labelled and the nodes whose user version label names it;
- Modules by ``SELECTOR_INDEX`` (one value per ``key=value`` of the
  selector; ``""`` for an empty selector), so a node event finds the Modules
  that select it without trying every Module; by ``DRIVER_INDEX``
  (``spec.dra.driverName``) and ``CLASS_INDEX`` (the DeviceClass names
  ``spec.dra`` lists), so claim and class events find their Modules;
- DeviceClasses by ``MODULE_INDEX`` (their module labels), ResourceClaims by
  ``DRIVER_INDEX`` (the drivers of their allocated devices).

``validations_of_pod`` maps a preflight pod's events to its validation (the
controller owner's name). The ``modules_of_*`` functions and
``module_of_object`` are the event-to-key mappings the wiring hands to
``runtime.handlers.enqueue_mapped``.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kmm.api import labels, preflight, scheduling
from kmm.runtime import stores

__all__ = [
    "BOOT_ID",
    "BUILD_POD_FIELDS",
    "CLAIM_FIELDS",
    "CLASS_INDEX",
    "CONTROLLER_UID",
    "DAEMONSET_FIELDS",
    "DEVICE_CLASS_FIELDS",
    "DRIVER_INDEX",
    "FAKE_NODE",
    "KWOK_ANNOTATION",
    "LOADER_STATUS_FIELDS",
    "MODULE_INDEX",
    "NODE_FIELDS",
    "OWNED_SELECTOR",
    "POD_FIELDS",
    "PREFLIGHT_INDEX",
    "PREFLIGHT_POD_FIELDS",
    "SELECTOR_INDEX",
    "STARTED",
    "boot_id",
    "claim_driver_index",
    "controller_uid",
    "fake_node",
    "module_class_index",
    "module_driver_index",
    "module_of_object",
    "module_selector_index",
    "modules_of_claim",
    "modules_of_device_class",
    "modules_of_node",
    "node_module_index",
    "object_module_index",
    "preflight_index",
    "project_daemonset",
    "project_node",
    "project_pod",
    "started",
    "validations_of_module_change",
    "validations_of_pod",
]

MODULE_INDEX: Final = "module"
SELECTOR_INDEX: Final = "selector"
DRIVER_INDEX: Final = "driver"
CLASS_INDEX: Final = "device-class"
PREFLIGHT_INDEX: Final = "preflight"

# Objects kmm made carry the role label; informers list only those.
OWNED_SELECTOR: Final = labels.ROLE

NODE_FIELDS: Final = (
    "metadata.labels",
    "spec.unschedulable",
    "spec.taints",
    "status.nodeInfo.kernelVersion",
)
DAEMONSET_FIELDS: Final = (
    "metadata.labels",
    "metadata.annotations",
    "metadata.deletionTimestamp",
    "status.desiredNumberScheduled",
    "status.currentNumberScheduled",
    "status.numberAvailable",
    "status.numberReady",
)
DEVICE_CLASS_FIELDS: Final = (
    "metadata.labels",
    "metadata.annotations",
    "metadata.deletionTimestamp",
)
CLAIM_FIELDS: Final = (
    "status.allocation.devices.results",
    "status.allocation.nodeSelector",
    "status.reservedFor",
)
POD_FIELDS: Final = (
    "metadata.labels",
    "metadata.deletionTimestamp",
    "spec.nodeName",
    "status.conditions",
)
# Build and sign pods (few) also keep what the build planner reads: the input
# hash, the phase, and the termination (message, exit code, finish time).
BUILD_POD_FIELDS: Final = (
    *POD_FIELDS,
    "metadata.annotations",
    "status.phase",
    "status.containerStatuses",
    "status.initContainerStatuses",
)
# Preflight pods: the same, and their owner (the validation, by uid).
PREFLIGHT_POD_FIELDS: Final = (*BUILD_POD_FIELDS, "metadata.ownerReferences")
# In the projected metadata of DaemonSets and pods: the uid of their
# controller owner, in place of the whole ``ownerReferences`` (a pod's five
# fields of it would cost more than the rest of what is kept of it).
CONTROLLER_UID: Final = "controllerUid"
# The parts of a loader container's status whose ``terminated.message`` is kept.
LOADER_STATUS_FIELDS: Final = ("state", "lastState")
_LOADER_ROLE: Final = "module-loader"
_BUILD_ROLES: Final = frozenset({"build", "sign", labels.PULL_ROLE})
# The annotation KWOK manages nodes by (its default
# ``manageNodesWithAnnotationSelector``, and the sandbox's fake nodes): a
# node that carries it runs no container. In a node's projection, the
# marker ``FAKE_NODE`` (a bool in the metadata kept) stands for it.
KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"
FAKE_NODE: Final = "fake"
# In the projected metadata of Nodes: ``status.nodeInfo.bootID``; of the
# pods of DaemonSets: their running container's ``startedAt`` (see above).
BOOT_ID: Final = "bootID"
STARTED: Final = "started"
_DAEMON_ROLES: Final = frozenset(typing.get_args(labels.Role))
_PREFLIGHT_ROLE: Final = "preflight"
_node_fields = stores.keep_fields(*NODE_FIELDS)
_daemonset_fields = stores.keep_fields(*DAEMONSET_FIELDS)
_pod_fields = stores.keep_fields(*POD_FIELDS)
_build_pod_fields = stores.keep_fields(*BUILD_POD_FIELDS)
_preflight_pod_fields = stores.keep_fields(*PREFLIGHT_POD_FIELDS)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of ``obj``'s controller owner: the projection's
    ``CONTROLLER_UID``, or the ``controller`` entry of a whole object's
    ``ownerReferences``; None when it has none."""
    metadata = obj.get("metadata") or {}
    kept = metadata.get(CONTROLLER_UID)
    if isinstance(kept, str):
        return kept
    for ref in metadata.get("ownerReferences") or ():
        if ref.get("controller") is True and isinstance(ref.get("uid"), str) and ref["uid"]:
            found: str = ref["uid"]
            return found
    return None


def _with_controller(obj: stores.RawObject, projected: stores.RawObject) -> stores.RawObject:
    uid = controller_uid(obj)
    if uid:
        # Interned: a DaemonSet's pods (hundreds) share their owner's uid.
        projected.setdefault("metadata", {})[CONTROLLER_UID] = sys.intern(uid)
    return projected


def _timeless(items: Any, times: frozenset[str]) -> Any:
    """A list of mappings without the keys ``times``; anything else as it is."""
    if not isinstance(items, list):
        return items
    return [
        {k: v for k, v in item.items() if k not in times} if isinstance(item, Mapping) else item
        for item in items
    ]


def _replaced(obj: stores.RawObject, part: str, field: str, value: Any) -> stores.RawObject:
    """``obj`` with ``obj[part][field]`` replaced (shallow copies; ``obj``
    itself is left alone)."""
    return {**obj, part: {**obj[part], field: value}}


_TAINT_TIMES: Final = frozenset({"timeAdded"})
_CONDITION_TIMES: Final = frozenset({"lastTransitionTime", "lastProbeTime"})


def project_node(obj: stores.RawObject) -> stores.RawObject:
    """The fields kept of a Node (``NODE_FIELDS``), its taints without
    ``timeAdded`` (which the node lifecycle controller sets per node on its
    ``NoExecute`` taints), ``FAKE_NODE`` when KWOK manages it (one flag,
    not the annotations: a node has many) and ``BOOT_ID`` when it reports
    one."""
    taints = (obj.get("spec") or {}).get("taints")
    if taints:
        obj = _replaced(obj, "spec", "taints", _timeless(taints, _TAINT_TIMES))
    projected = _node_fields(obj)
    extra: dict[str, Any] = {}
    if KWOK_ANNOTATION in (_meta(obj).get("annotations") or {}):
        extra[FAKE_NODE] = True
    boot = boot_id(obj)
    if boot:
        extra[BOOT_ID] = boot
    if extra:
        projected["metadata"] = {**(projected.get("metadata") or {}), **extra}
    return projected


def fake_node(node: Mapping[str, Any]) -> bool:
    """Whether KWOK manages ``node`` (projected, or whole)."""
    metadata = _meta(node)
    return bool(metadata.get(FAKE_NODE)) or KWOK_ANNOTATION in (metadata.get("annotations") or {})


def boot_id(node: Mapping[str, Any]) -> str:
    """``node``'s boot id (projected, or whole); "" when it reports none."""
    kept = _meta(node).get(BOOT_ID)
    if isinstance(kept, str):
        return kept
    found = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    return found if isinstance(found, str) else ""


def _start(obj: Mapping[str, Any]) -> str | None:
    """The latest ``startedAt`` of ``obj``'s running containers (RFC 3339
    times of one clock, the node's, compare as strings)."""
    found = [
        at
        for status in (obj.get("status") or {}).get("containerStatuses") or ()
        if isinstance(
            at := ((status.get("state") or {}).get("running") or {}).get("startedAt"), str
        )
    ]
    return max(found) if found else None


def started(pod: Mapping[str, Any]) -> str | None:
    """When the running container of a DaemonSet's pod started (projected,
    or whole); None while none runs, and for other pods. A new value is a
    new container: one whose ``postStart`` ran since."""
    if _labels(pod).get(labels.ROLE) not in _DAEMON_ROLES:
        return None
    kept = _meta(pod).get(STARTED)
    return kept if isinstance(kept, str) else _start(pod)


def project_daemonset(obj: stores.RawObject) -> stores.RawObject:
    """The fields kept of a DaemonSet, with its controller's uid."""
    return _with_controller(obj, _daemonset_fields(obj))


def project_pod(obj: stores.RawObject) -> stores.RawObject:
    """The fields kept of a pod, with its controller's uid: more of build,
    sign and preflight pods than of the many others, but not their registry
    CA annotation (up to 240 KiB each, which no planner reads); of loader
    pods, their containers' termination messages too; of the pods of
    DaemonSets, ``STARTED`` while a container runs."""
    role = _labels(obj).get(labels.ROLE)
    if role in _BUILD_ROLES:
        return _with_controller(obj, _without_registry_ca(_build_pod_fields(obj)))
    if role == _PREFLIGHT_ROLE:
        return _with_controller(obj, _without_registry_ca(_preflight_pod_fields(obj)))
    conditions = (obj.get("status") or {}).get("conditions")
    if conditions:
        obj = _replaced(obj, "status", "conditions", _timeless(conditions, _CONDITION_TIMES))
    projected = _with_controller(obj, _pod_fields(obj))
    if role == _LOADER_ROLE:
        statuses = _termination_messages((obj.get("status") or {}).get("containerStatuses"))
        if statuses:
            # New mappings: the projection's own may be shared with other
            # objects' equal ones (``stores.keep_fields``).
            status = {**(projected.get("status") or {}), "containerStatuses": statuses}
            projected = {**projected, "status": status}
    start = started(obj)
    if start is not None:
        projected.setdefault("metadata", {})[STARTED] = start
    return projected


def _termination_messages(statuses: Any) -> list[stores.RawObject]:
    """Of each container status, its name and the non-empty termination
    messages of ``state`` and ``lastState``; statuses without one are left out."""
    kept: list[stores.RawObject] = []
    for status in statuses if isinstance(statuses, list) else ():
        if not isinstance(status, Mapping):
            continue
        found: stores.RawObject = {}
        for part in LOADER_STATUS_FIELDS:
            message = ((status.get(part) or {}).get("terminated") or {}).get("message")
            if isinstance(message, str) and message:
                found[part] = {"terminated": {"message": message}}
        if found:
            kept.append({"name": status.get("name"), **found})
    return kept


def _without_registry_ca(kept: stores.RawObject) -> stores.RawObject:
    annotations = (kept.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(labels.REGISTRY_CA, None)
    return kept


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return found


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def module_of_object(obj: Mapping[str, Any]) -> str | None:
    """``<ns>/<name>`` of the Module a DaemonSet, pod or DeviceClass is
    labelled for; None for a preflight pod (made for a validation: the
    Module's reconcile neither sees it nor hears of it), and None for a
    namespaced object whose ``module.namespace`` label is not its own
    namespace (a Module's objects live beside it: an object elsewhere names
    no Module). Labels only: ``ownership.owned`` decides what counts."""
    found = _labels(obj)
    if found.get(labels.ROLE) == _PREFLIGHT_ROLE:
        return None
    namespace, name = found.get(labels.MODULE_NAMESPACE), found.get(labels.MODULE_NAME)
    own = _meta(obj).get("namespace")
    if own and own != namespace:
        return None
    return f"{namespace}/{name}" if namespace and name else None


def object_module_index(obj: stores.RawObject) -> Iterable[str]:
    key = module_of_object(obj)
    return (key,) if key else ()


def _module_key(label: str) -> str | None:
    found = labels.module_of_node_label(label)
    return f"{found[0]}/{found[1]}" if found else None


def node_module_index(obj: stores.RawObject) -> Iterable[str]:
    return {key for label in _labels(obj) if (key := _module_key(label))}


def module_selector_index(obj: stores.RawObject) -> Iterable[str]:
    selector: Mapping[str, str] = (obj.get("spec") or {}).get("selector") or {}
    if not isinstance(selector, Mapping) or not selector:
        return ("",)
    return tuple(f"{key}={value}" for key, value in selector.items())


def modules_of_node(node: Mapping[str, Any], modules_store: stores.Store) -> list[str]:
    """Keys of the Modules a node event concerns: those selecting it, and
    those whose labels it carries (it may have just stopped matching)."""
    node_labels = _labels(node)
    candidates: set[str] = set(modules_store.index_keys(SELECTOR_INDEX, ""))
    for key, value in node_labels.items():
        candidates.update(modules_store.index_keys(SELECTOR_INDEX, f"{key}={value}"))
    found: set[str] = set()
    for key in candidates:
        module = modules_store.get(key)
        selector = ((module or {}).get("spec") or {}).get("selector") or {}
        if isinstance(selector, Mapping) and scheduling.matches_selector(node_labels, selector):
            found.add(key)
    found.update(m for label in node_labels if (m := _module_key(label)))
    return sorted(found)


def _dra(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = (obj.get("spec") or {}).get("dra")
    return found if isinstance(found, Mapping) else {}


def module_driver_index(obj: stores.RawObject) -> Iterable[str]:
    driver = _dra(obj).get("driverName")
    return (driver,) if isinstance(driver, str) and driver else ()


def module_class_index(obj: stores.RawObject) -> Iterable[str]:
    listed = _dra(obj).get("deviceClasses") or ()
    return {c["name"] for c in listed if isinstance(c, Mapping) and isinstance(c.get("name"), str)}


def claim_driver_index(obj: stores.RawObject) -> Iterable[str]:
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return {r["driver"] for r in results if isinstance(r.get("driver"), str)}


def modules_of_claim(claim: Mapping[str, Any], modules_store: stores.Store) -> list[str]:
    """Modules whose driver a claim's allocated devices belong to."""
    return sorted(
        {
            key
            for driver in claim_driver_index(dict(claim))
            for key in modules_store.index_keys(DRIVER_INDEX, driver)
        }
    )


def modules_of_device_class(
    device_class: Mapping[str, Any], modules_store: stores.Store
) -> list[str]:
    """The Module a DeviceClass is labelled for, and every Module listing its name."""
    name = (device_class.get("metadata") or {}).get("name") or ""
    found: set[str] = set(modules_store.index_keys(CLASS_INDEX, name))
    owner = module_of_object(device_class)
    if owner is not None:
        found.add(owner)
    return sorted(found)


def preflight_index(obj: stores.RawObject) -> Iterable[str]:
    """A preflight pod's ``labels.PREFLIGHT`` value (its validation's)."""
    found = _labels(obj)
    if found.get(labels.ROLE) != _PREFLIGHT_ROLE:
        return ()
    value = found.get(labels.PREFLIGHT)
    return (value,) if value else ()


def validations_of_pod(pod: Mapping[str, Any]) -> list[str]:
    """The PreflightValidation a preflight pod answers: its controller owner
    (the event is only a key: the validation's planner reads the pods it
    owns, by uid, where it expects them)."""
    if _labels(pod).get(labels.ROLE) != _PREFLIGHT_ROLE:
        return []
    return [
        ref["name"]
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or ()
        if ref.get("controller") is True
        and ref.get("kind") == preflight.KIND
        and str(ref.get("apiVersion", "")).startswith(f"{preflight.GROUP}/")
        and isinstance(ref.get("name"), str)
    ]


def validations_of_module_change(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> bool:
    """Whether a Module event can change a validation's verdicts: a Module
    added or deleted, its spec changed (``generation``) or its deletion
    begun. Status writes (the Module reconciler's) are not."""
    if old is None or new is None:
        return True
    before, after = old.get("metadata") or {}, new.get("metadata") or {}
    return before.get("generation") != after.get("generation") or bool(
        before.get("deletionTimestamp")
    ) != bool(after.get("deletionTimestamp"))
