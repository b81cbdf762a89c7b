"""What one reconcile sees of the cluster for one Module: a read-only view.

``read`` takes it from the informer caches (``Caches``: the stores the
informers own and fill) once, at the start of a reconcile, so every
planner (``loader``, ``deviceplugin``, ``dra``, ``upgrade``, ``build``)
judges the same moment; ``build`` makes it of the parts ``read`` picked.
The view holds the cached dicts themselves: planners read them and never
change them.

Its DaemonSets and pods are the Module's by namespace and owners, never by
labels alone (``ownership.owned``: a tenant can label its own objects as
anyone's Module's): a planner may take every DaemonSet and pod of the view
as the Module's, to count, wait for, or delete. Its DeviceClasses are the
ones the Module labelled (with its uid) and the ones ``spec.dra`` names,
whoever owns them: ``ownership.class_owned`` tells which are the Module's, and
a listed name taken by another is a conflict.

For ordered upgrades of a DRA Module (``upgrade.taints``) it also holds,
where the cluster serves DeviceTaintRules (``taint_api``, the version):
the ResourceSlices of the Module's driver (``devicecaches``), the rules
labelled for the Module (any uid: the planner tells its own from an
earlier Module's of the same name), and per node the other Modules whose
DRA pods (``ownership.owned``) run there with the same driver name
(``rivals``: their slices cannot be told from this Module's).

Its ``stale`` pods are those whose shown container ran in an earlier boot of
their node (``boots``): Ready by their conditions, they hold nothing since
the reboot, and ``ready`` says so; planners ask ``ready``, not
``is_pod_ready``, whether a pod of the Module's DaemonSets is Ready now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kmm.api import labels, modules, scheduling
from kmm.operator import boots, caches, devicecaches, ownership
from kmm.runtime import stores

__all__ = ["Caches", "ModuleView", "build", "containers_ready", "is_pod_ready", "read", "role"]

RawObject = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def containers_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet's ``ContainersReady``: True on a pod whose containers
    became ready and whose node stopped reporting (the node controller
    turns only ``Ready`` False then)."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "ContainersReady" and c.get("status") == "True" for c in conditions)


@dataclasses.dataclass(frozen=True)
class Caches:
    """The stores a view is read from (the informers own and fill them)."""

    modules: stores.Store
    daemonsets: stores.Store
    pods: stores.Store
    nodes: stores.Store
    # Filled only when the cluster serves resource.k8s.io/v1 (``resource_api``).
    device_classes: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={caches.MODULE_INDEX: caches.object_module_index}
        )
    )
    claims: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={caches.DRIVER_INDEX: caches.claim_driver_index}
        )
    )
    resource_api: bool = True
    # Filled only when the cluster serves DeviceTaintRules (``taint_api``:
    # the resource.k8s.io version that does; ``deviceapis``).
    slices: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={devicecaches.DRIVER_INDEX: devicecaches.slice_driver_index}
        )
    )
    taint_rules: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={caches.MODULE_INDEX: caches.object_module_index}
        )
    )
    taint_api: str | None = None
    # The operator was told not to use device taints (``--no-device-taints``).
    taints_off: bool = False
    # Pods Ready from an earlier boot of their node, fed by the Node and pod
    # informers' events (``boots``); none marked when nothing feeds it.
    boots: boots.Boots | None = None


@dataclasses.dataclass(frozen=True)
class ModuleView:
    """One Module and the objects that concern it, as the caches hold them."""

    raw: RawObject
    module: modules.Module
    # Nodes matching spec.selector, by name; and nodes carrying this
    # Module's labels (they may have stopped matching).
    selected: Sequence[RawObject]
    labelled: Sequence[RawObject]
    daemonsets: Mapping[str, Sequence[RawObject]]  # by role
    pods: Mapping[str, Sequence[RawObject]]  # by role
    # DRA: whether the cluster serves resource.k8s.io/v1; the DeviceClasses
    # named in spec.dra (whoever owns them) or the Module's
    # (``ownership.class_owned``), by name; the ResourceClaims allocated with a
    # device of the Module's driver.
    resource_api: bool = True
    device_classes: Mapping[str, RawObject] = dataclasses.field(default_factory=dict)
    claims: Sequence[RawObject] = ()
    # Uids of pods Ready from an earlier boot of their node (``boots``).
    stale: frozenset[str] = frozenset()
    # Device taints (ordered upgrades of a DRA Module): the resource.k8s.io
    # version serving DeviceTaintRules (None: none does, or ``taints_off``:
    # the operator was told not to use them), the driver's
    # ResourceSlices, the rules labelled for the Module, and per node the
    # other Modules running a DRA pod of the same driver name there.
    taint_api: str | None = None
    taints_off: bool = False
    slices: Sequence[RawObject] = ()
    taint_rules: Sequence[RawObject] = ()
    rivals: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)

    def ready(self, pod: Mapping[str, Any]) -> bool:
        """``is_pod_ready``, and its container started in its node's current boot."""
        return is_pod_ready(pod) and _meta(pod).get("uid") not in self.stale

    @property
    def namespace(self) -> str:
        return self.module.metadata.namespace or ""

    @property
    def name(self) -> str:
        return self.module.metadata.name

    @property
    def version(self) -> str | None:
        """``moduleLoader.container.version``: ordered upgrades are on when set."""
        loader = self.module.spec.module_loader
        return loader.container.version if loader is not None else None

    def nodes(self) -> dict[str, RawObject]:
        """Every node this reconcile may label: the selected and the labelled, by name."""
        return {_meta(n)["name"]: n for n in (*self.selected, *self.labelled)}

    def selected_names(self) -> set[str]:
        return {_meta(n)["name"] for n in self.selected}

    def pods_on(self, node: str, *roles: str) -> list[RawObject]:
        """The Module's pods of ``roles`` bound to ``node``, terminating ones included."""
        return [
            pod
            for role in roles
            for pod in self.pods.get(role, ())
            if (pod.get("spec") or {}).get("nodeName") == node
        ]


def role(obj: Mapping[str, Any]) -> str:
    """The ``labels.ROLE`` of a DaemonSet or pod kmm made; "" for none."""
    value = (_meta(obj).get("labels") or {}).get(labels.ROLE)
    return value if isinstance(value, str) else ""


def _by_role(objs: Iterable[RawObject]) -> dict[str, list[RawObject]]:
    found: dict[str, list[RawObject]] = {}
    for obj in objs:
        found.setdefault(role(obj), []).append(obj)
    return found


def build(
    raw: RawObject,
    module: modules.Module,
    *,
    nodes: stores.Store,
    daemonsets: Iterable[RawObject],
    pods: Iterable[RawObject],
    labelled: Iterable[RawObject],
    device_classes: Iterable[RawObject] = (),
    claims: Iterable[RawObject] = (),
    resource_api: bool = True,
    stale: frozenset[str] = frozenset(),
    taint_api: str | None = None,
    taints_off: bool = False,
    slices: Iterable[RawObject] = (),
    taint_rules: Iterable[RawObject] = (),
    rivals: Mapping[str, Sequence[str]] | None = None,
) -> ModuleView:
    """The view of ``module`` from the caches (its own DaemonSets and pods,
    as ``ownership.owned`` counts them, its DeviceClasses and its driver's
    claims given; ``stale``: the uids ``boots`` marks)."""
    selected = sorted(
        (
            n
            for n in nodes.objects()
            if scheduling.matches_selector(_meta(n).get("labels"), module.spec.selector)
        ),
        key=lambda n: _meta(n)["name"],
    )
    return ModuleView(
        raw=raw,
        module=module,
        selected=selected,
        labelled=sorted(labelled, key=lambda n: _meta(n)["name"]),
        daemonsets=_by_role(daemonsets),
        pods=_by_role(pods),
        resource_api=resource_api,
        device_classes={_meta(c)["name"]: c for c in device_classes},
        claims=list(claims),
        stale=stale,
        taint_api=taint_api,
        taints_off=taints_off,
        slices=list(slices),
        taint_rules=list(taint_rules),
        rivals=dict(rivals or {}),
    )


def read(raw: RawObject, module: modules.Module, *, key: str, cached: Caches) -> ModuleView:
    """The view of the Module ``key`` from ``cached``: what counts as its own
    (``ownership``: by namespace and owners, never by labels alone), the
    DeviceClasses ``spec.dra`` lists (whoever owns them) and the claims of
    its driver."""
    ours = ownership.owned(raw, daemonsets=cached.daemonsets, pods=cached.pods)
    classes: dict[str, RawObject] = {
        c["metadata"]["name"]: c for c in ownership.module_classes(raw, cached.device_classes)
    }
    claims: list[RawObject] = []
    slices: list[RawObject] = []
    rivals: dict[str, list[str]] = {}
    loader = module.spec.module_loader
    versioned = loader is not None and loader.container.version is not None
    if module.spec.dra is not None and cached.taint_api is not None and versioned:
        # Only ordered upgrades taint (``upgrade.taints``).
        driver = module.spec.dra.driver_name
        slices = cached.slices.by_index(devicecaches.DRIVER_INDEX, driver)
        rivals = _rivals(key, driver, cached)
    if module.spec.dra is not None:
        for listed in module.spec.dra.device_classes or ():
            found = cached.device_classes.get(listed.name)
            if found is not None:
                classes[listed.name] = found
        claims = cached.claims.by_index(caches.DRIVER_INDEX, module.spec.dra.driver_name)
    return build(
        raw,
        module,
        nodes=cached.nodes,
        daemonsets=ours.daemonsets,
        pods=ours.pods,
        labelled=cached.nodes.by_index(caches.MODULE_INDEX, key),
        device_classes=classes.values(),
        claims=claims,
        resource_api=cached.resource_api,
        stale=cached.boots.stale(ours.pods) if cached.boots is not None else frozenset(),
        taint_api=cached.taint_api,
        taints_off=cached.taints_off,
        slices=slices,
        taint_rules=cached.taint_rules.by_index(caches.MODULE_INDEX, key),
        rivals=rivals,
    )


def _rivals(key: str, driver: str, cached: Caches) -> dict[str, list[str]]:
    """Per node, the other Modules naming ``driver`` whose DRA pods run there."""
    found: dict[str, list[str]] = {}
    for other in cached.modules.index_keys(caches.DRIVER_INDEX, driver):
        raw = cached.modules.get(other)
        if other == key or raw is None:
            continue
        ours = ownership.owned(raw, daemonsets=cached.daemonsets, pods=cached.pods)
        for pod in ours.pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if role(pod) == "dra" and isinstance(node, str):
                found.setdefault(node, []).append(other)
    return found
