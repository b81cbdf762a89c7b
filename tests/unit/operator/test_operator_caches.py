"""What counts as a Module's in the caches: its namespace and its owners, not its labels.

A tenant can label objects of its own namespace as another namespace's
Module's; these tests plant such objects beside the Module's own and check
that the projections keep the controller's uid, the index ignores objects
elsewhere, and ``ownership.owned`` counts only what the Module owns.
"""

from __future__ import annotations

from typing import Any

from kmm.api import labels
from kmm.operator import caches, ownership
from kmm.runtime import stores

Obj = dict[str, Any]

MODULE_UID = "uid-module"


def _module(namespace: str = "ns", name: str = "m", uid: str = MODULE_UID) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}}


def _ref(uid: str, kind: str = "DaemonSet", *, controller: bool = True) -> Obj:
    return {"apiVersion": "v1", "kind": kind, "name": "x", "uid": uid, "controller": controller}


def _object(
    name: str,
    role: str,
    *,
    namespace: str = "ns",
    labelled: tuple[str, str] = ("ns", "m"),
    uid: str | None = None,
    owners: tuple[Obj, ...] = (),
) -> Obj:
    metadata: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "resourceVersion": "1",
        "labels": {**labels.module_labels(labelled[0], labelled[1], role)},  # type: ignore[arg-type]
        "ownerReferences": list(owners),
    }
    return {"metadata": metadata, "spec": {"nodeName": "n0"}, "status": {}}


def _stores(daemonsets: list[Obj], pods: list[Obj]) -> tuple[stores.Store, stores.Store]:
    """Stores as the wiring fills them: projected, indexed by the labels."""
    ds_store = stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index})
    pod_store = stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index})
    for ds in daemonsets:
        ds_store.put(caches.project_daemonset(ds))
    for pod in pods:
        pod_store.put(caches.project_pod(pod))
    return ds_store, pod_store


def _names(found: list[Obj]) -> list[str]:
    return sorted(f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in found)


def test_projections_keep_the_controller_uid_and_not_the_owner_references() -> None:
    ds = _object("loader", "module-loader", owners=(_ref(MODULE_UID, "Module"),))
    ds["metadata"]["ownerReferences"].insert(0, _ref("uid-other", "Thing", controller=False))
    kept = caches.project_daemonset(ds)
    assert kept["metadata"][caches.CONTROLLER_UID] == MODULE_UID
    assert "ownerReferences" not in kept["metadata"]
    assert caches.controller_uid(kept) == caches.controller_uid(ds) == MODULE_UID
    pods = [
        caches.project_pod(_object(f"p{i}", "module-loader", owners=(_ref("uid-ds-" + "0" * 30),)))
        for i in range(2)
    ]
    assert all("ownerReferences" not in p["metadata"] for p in pods)
    # The pods of one DaemonSet share one string for its uid.
    assert pods[0]["metadata"][caches.CONTROLLER_UID] is pods[1]["metadata"][caches.CONTROLLER_UID]
    # No controller (a reference that is not one): nothing kept, nothing counted.
    bare = caches.project_pod(_object("p", "module-loader", owners=(_ref("u", controller=False),)))
    assert caches.CONTROLLER_UID not in bare["metadata"]
    assert caches.controller_uid(bare) is None


def test_an_object_names_a_module_of_its_own_namespace_only() -> None:
    mine = _object("ds", "module-loader")
    planted = _object("ds", "module-loader", namespace="tenant")  # labelled ns/m
    assert caches.module_of_object(mine) == "ns/m"
    assert list(caches.object_module_index(mine)) == ["ns/m"]
    assert caches.module_of_object(planted) is None
    assert list(caches.object_module_index(planted)) == []
    # Cluster-scoped (DeviceClasses): the labels, as before.
    device_class = {"metadata": {"name": "c", "labels": labels.module_labels("ns", "m", "dra")}}
    assert caches.module_of_object(device_class) == "ns/m"


def test_daemonsets_count_by_namespace_and_controller_uid() -> None:
    ours = _object("loader", "module-loader", owners=(_ref(MODULE_UID, "Module"),))
    planted = _object(
        "loader", "module-loader", namespace="tenant", owners=(_ref(MODULE_UID, "Module"),)
    )
    earlier = _object("old", "module-loader", owners=(_ref("uid-earlier-m", "Module"),))
    unowned = _object("fluentd", "module-loader")
    daemonsets, pods = _stores([ours, planted, earlier, unowned], [])
    found = ownership.owned(_module(), daemonsets=daemonsets, pods=pods)
    assert _names(found.daemonsets) == ["ns/loader"]
    assert _names(ownership.module_daemonsets(_module(), daemonsets)) == ["ns/loader"]
    # A Module without a uid (never one from the API server) owns nothing.
    assert ownership.owned(_module(uid=""), daemonsets=daemonsets, pods=pods).daemonsets == []


def test_pods_count_through_the_modules_daemonsets_or_the_module() -> None:
    ours = _object("loader", "module-loader", uid="uid-ds", owners=(_ref(MODULE_UID, "Module"),))
    earlier = _object("old", "module-loader", uid="uid-old", owners=(_ref("uid-earlier"),))
    pods = [
        _object("of-ours", "module-loader", owners=(_ref("uid-ds"),)),
        _object("of-earlier", "module-loader", owners=(_ref("uid-old"),)),
        # Its DaemonSet deleted (the garbage collector follows): it may be
        # unloading, so it counts, here in the Module's namespace.
        _object("orphan", "device-plugin", owners=(_ref("uid-deleted-ds"),)),
        _object("no-controller", "module-loader"),
        _object("m-build-k", "build", owners=(_ref(MODULE_UID, "Module"),)),
        _object("m-sign-k", "sign", owners=(_ref("uid-someone", "Module"),)),
        _object("stray-role", "something", owners=(_ref("uid-ds"),)),
        # Elsewhere, labelled for ns/m, whatever they claim as owners.
        _object("of-ours", "module-loader", namespace="tenant", owners=(_ref("uid-ds"),)),
        _object("orphan", "dra", namespace="tenant", owners=(_ref("uid-gone"),)),
        _object("m-build-k", "build", namespace="tenant", owners=(_ref(MODULE_UID, "Module"),)),
    ]
    daemonsets, pod_store = _stores([ours, earlier], pods)
    found = ownership.owned(_module(), daemonsets=daemonsets, pods=pod_store)
    assert _names(found.pods) == ["ns/m-build-k", "ns/of-ours", "ns/orphan"]


def test_device_classes_are_the_modules_by_their_uid_label() -> None:
    named = labels.module_labels("ns", "m", "dra")
    stamped = {"metadata": {"name": "a", "labels": {**named, labels.MODULE_UID: MODULE_UID}}}
    earlier = {"metadata": {"name": "b", "labels": {**named, labels.MODULE_UID: "uid-earlier"}}}
    legacy = {"metadata": {"name": "c", "labels": dict(named)}}
    ids = {"namespace": "ns", "name": "m"}
    assert ownership.class_owned(stamped, **ids, uid=MODULE_UID)
    assert not ownership.class_owned(earlier, **ids, uid=MODULE_UID)
    assert not ownership.class_owned(legacy, **ids, uid=MODULE_UID)
    assert not ownership.class_owned(stamped, namespace="ns", name="other", uid=MODULE_UID)
    assert not ownership.class_owned(stamped, **ids, uid=None)
    assert [ownership.class_adoptable(c, **ids) for c in (stamped, earlier, legacy)] == [
        False,
        False,
        True,
    ]


def _validation_ref(name: str, *, controller: bool) -> Obj:
    return {
        **_ref(f"uid-{name}", "PreflightValidation", controller=controller),
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta2",
        "name": name,
    }


def test_a_preflight_pod_answers_its_controller_only() -> None:
    pod = _object("pfv-m", "preflight")
    pod["metadata"]["ownerReferences"] = [
        _validation_ref("a", controller=False),
        _validation_ref("b", controller=True),
    ]
    kept = caches.project_pod(pod)
    assert caches.validations_of_pod(kept) == ["b"]
    assert caches.controller_uid(kept) == "uid-b"
    assert caches.module_of_object(kept) is None
