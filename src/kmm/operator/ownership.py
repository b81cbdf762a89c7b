"""Which cached objects are a Module's: its namespace and its owners say, not its labels.

Labels are anyone's to write: the informers list every object in the
cluster that carries the role label, in any namespace, so a tenant can
label a DaemonSet or pod of its own as another tenant's Module's. The
labels only say where to look (``caches.MODULE_INDEX``, and the event ->
key mappings of ``caches``: a hostile object at worst enqueues a Module,
whose reconcile then ignores it); ``owned`` decides what counts:

- a DaemonSet in the Module's namespace whose controller is the Module
  (its uid, so not an earlier Module of the same name either);
- a loader, device-plugin or DRA pod in the Module's namespace whose
  controller is one of those DaemonSets; or whose controller is no
  DaemonSet the cache holds for that Module's labels there: its DaemonSet
  was deleted and the garbage collector is deleting it (a Module's
  deletion, an upgrade's old version), or the pod came before its
  DaemonSet's event. Such a pod still counts (it may be unloading the
  module in ``preStop``), found by its labels, in the Module's own
  namespace only; a pod whose controller does not exist at all is the
  garbage collector's to delete, and one with no controller never counts;
- a build, sign or pull pod in the Module's namespace whose controller is
  the Module;
- a DeviceClass (cluster-scoped: no owner reference can name a namespaced
  Module) labelled with the Module's namespace, name and uid
  (``labels.MODULE_UID``; ``class_owned``, ``module_classes``). One listed
  in ``spec.dra`` that carries the Module's labels but no uid, as kmm made
  them before it stamped uids, is taken as the Module's to update (the
  update stamps it) and never deleted unstamped (``class_adoptable``).

Preflight pods answer a ``PreflightValidation`` (``kmm.operator.preflight``),
not a Module: they count for no Module, and for a validation only when it
(its uid) is their controller and they sit where its planner expects them.

Pure: ``views.read`` (and a Module's deletion, ``finalizing``) hands over
the stores ``caches`` describes (projected, so an object's controller is
``caches.controller_uid``) and the Module's raw object; ``views.build``
then holds only what counts here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kmm.api import labels
from kmm.operator import caches
from kmm.runtime import stores

__all__ = [
    "Owned",
    "class_adoptable",
    "class_owned",
    "module_classes",
    "module_daemonsets",
    "owned",
]

_BUILD_ROLES: Final = frozenset({"build", "sign", labels.PULL_ROLE})
_WORKLOAD_ROLES: Final = frozenset({"module-loader", "device-plugin", "dra"})


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = _meta(obj).get("labels") or {}
    return found


@dataclasses.dataclass(frozen=True)
class Owned:
    """What counts as one Module's among the cached DaemonSets and pods."""

    daemonsets: list[stores.RawObject]
    pods: list[stores.RawObject]


def owned(module: Mapping[str, Any], *, daemonsets: stores.Store, pods: stores.Store) -> Owned:
    """The Module's DaemonSets and pods, by the rules of this module's
    docstring: the labels find the candidates in the Module's namespace
    (``caches.MODULE_INDEX``), the owners decide."""
    metadata = _meta(module)
    uid = metadata.get("uid")
    if not uid:
        return Owned([], [])  # never from the API server; nothing can be checked
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    labelled = daemonsets.by_index(caches.MODULE_INDEX, key)
    ours = _controlled(labelled, uid)
    counted = {found for ds in ours if (found := _meta(ds).get("uid"))}
    known = {found for ds in labelled if (found := _meta(ds).get("uid"))}
    found_pods: list[stores.RawObject] = []
    for pod in pods.by_index(caches.MODULE_INDEX, key):
        role, controller = _labels(pod).get(labels.ROLE), caches.controller_uid(pod)
        if controller is None:
            continue
        if role in _BUILD_ROLES:
            counts = controller == uid
        elif role in _WORKLOAD_ROLES:
            # Its DaemonSet gone (deleted: the garbage collector follows), it
            # still runs, maybe unloading the module: counted by its labels,
            # which the index took from this namespace only.
            counts = controller in counted or controller not in known
        else:
            counts = False
        if counts:
            found_pods.append(pod)
    return Owned(ours, found_pods)


def _controlled(found: Iterable[stores.RawObject], uid: str) -> list[stores.RawObject]:
    return [obj for obj in found if caches.controller_uid(obj) == uid]


def module_daemonsets(
    module: Mapping[str, Any], daemonsets: stores.Store
) -> list[stores.RawObject]:
    """The Module's DaemonSets: ``owned(...).daemonsets`` without the pods."""
    metadata = _meta(module)
    uid = metadata.get("uid")
    if not uid:
        return []
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    return _controlled(daemonsets.by_index(caches.MODULE_INDEX, key), uid)


def _names_module(obj: Mapping[str, Any], namespace: str, name: str) -> bool:
    found = _labels(obj)
    return found.get(labels.MODULE_NAMESPACE) == namespace and found.get(labels.MODULE_NAME) == name


def class_owned(
    device_class: Mapping[str, Any], *, namespace: str, name: str, uid: str | None
) -> bool:
    """Whether a DeviceClass is the Module's: labelled with its namespace,
    name and uid (``labels.MODULE_UID``)."""
    return (
        bool(uid)
        and _names_module(device_class, namespace, name)
        and _labels(device_class).get(labels.MODULE_UID) == uid
    )


def module_classes(
    module: Mapping[str, Any], device_classes: stores.Store
) -> list[stores.RawObject]:
    """The Module's DeviceClasses: those its labels find (``caches.MODULE_INDEX``)
    that ``class_owned`` says are its."""
    metadata = _meta(module)
    namespace, name = metadata["namespace"], metadata["name"]
    return [
        c
        for c in device_classes.by_index(caches.MODULE_INDEX, f"{namespace}/{name}")
        if class_owned(c, namespace=namespace, name=name, uid=metadata.get("uid"))
    ]


def class_adoptable(device_class: Mapping[str, Any], *, namespace: str, name: str) -> bool:
    """Whether a DeviceClass carries the Module's labels and no uid at all,
    as kmm made them before it stamped uids: the Module updates it (and so
    stamps it) when it lists its name, and never deletes it unstamped."""
    return _names_module(device_class, namespace, name) and labels.MODULE_UID not in _labels(
        device_class
    )
