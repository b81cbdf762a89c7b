"""A tenant's objects labelled as another namespace's Module's change nothing of it.

The Module reconciler against in-memory caches (indexed and projected as
the wiring does) and the recording writer; in each test a hostile object in
the namespace ``tenant`` carries the labels of the Module ``ns/m`` (and,
where it helps the attack, the Module's uid as owner).
"""

from __future__ import annotations

import copy
from typing import Any

import operator_fixtures as fixtures
import pytest
from test_operator_reconciler import RecordingWriter

from kmm.api import labels
from kmm.operator import caches, reconciler, views
from kmm.runtime import stores

K68, K61, _ = fixtures.KERNELS
READY = labels.ready("ns", "m")
MODULE_UID = fixtures.module_raw()["metadata"]["uid"]


class ProjectingStore(stores.Store):
    """A store that keeps what the wiring's informer would: the projection."""

    def __init__(self, projection: stores.Projection, **options: Any) -> None:
        super().__init__(**options)
        self.projection = projection

    def put(self, obj: stores.RawObject) -> stores.RawObject | None:
        return super().put(self.projection(copy.deepcopy(obj)))


@pytest.fixture
def world() -> tuple[reconciler.ModuleReconciler, RecordingWriter, views.Caches]:
    index = {caches.MODULE_INDEX: caches.object_module_index}
    cached = views.Caches(
        modules=stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index}),
        daemonsets=ProjectingStore(caches.project_daemonset, indexers=index),
        pods=ProjectingStore(caches.project_pod, indexers=index),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
    )
    for node in (fixtures.node("n0", K68), fixtures.node("n1", K61)):
        cached.nodes.put(node)
    writer = RecordingWriter(cached)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    return rec, writer, cached


def _planted(obj: dict[str, Any], name: str, *, owner: str = MODULE_UID) -> dict[str, Any]:
    """``obj`` (a DaemonSet or pod of ``ns/m``) as a tenant's copy: in its own
    namespace, its own uid, the victim's labels, ``owner`` as controller."""
    found = copy.deepcopy(obj)
    found["metadata"].update(
        name=name,
        namespace="tenant",
        uid=f"uid-tenant-{name}",
        ownerReferences=[
            {"apiVersion": "v1", "kind": "Module", "name": "m", "uid": owner, "controller": True}
        ],
    )
    return found


def _pod(ds: dict[str, Any], node: str) -> dict[str, Any]:
    """A Ready pod of the cached (projected: no template) DaemonSet ``ds``,
    labelled as kmm's DaemonSets label their pods (as themselves)."""
    template = {"template": {"metadata": {"labels": ds["metadata"]["labels"]}}}
    return fixtures.pod({**ds, "spec": template}, node)


def _node_of(ds: dict[str, Any]) -> str:
    return "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"


def _ready_nodes(cached: views.Caches) -> set[str]:
    return {
        n["metadata"]["name"] for n in cached.nodes.objects() if READY in n["metadata"]["labels"]
    }


async def test_a_planted_daemonset_elsewhere_is_neither_counted_nor_deletes_anything(
    world: Any,
) -> None:
    """Labelled as ns/m's loader, owned (it says) by the Module, named like an
    unrelated DaemonSet of the victim's namespace: the reconcile neither
    counts it as a stray loader nor deletes anything by its name."""
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    loader = cached.daemonsets.objects()[0]
    cached.daemonsets.put(_planted(loader, "fluentd"))
    # The victim's own fluentd, as the cache would hold it were it labelled.
    cached.daemonsets.put({"metadata": {"name": "fluentd", "namespace": "ns", "uid": "uid-fluentd", "labels": {labels.ROLE: "logging"}}})  # fmt: skip
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert [c for c in writer.calls if c[0] == "delete"] == []
    assert cached.daemonsets.get("ns/fluentd") is not None
    assert cached.daemonsets.get("tenant/fluentd") is not None


async def test_a_ready_pod_elsewhere_does_not_make_a_node_look_loaded(world: Any) -> None:
    rec, _, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    for ds in cached.daemonsets.objects():
        node = _node_of(ds)
        planted = _planted(_pod(ds, node), f"pod-{node}")
        # Even claiming the Module's own DaemonSet as its controller.
        planted["metadata"]["ownerReferences"][0]["uid"] = ds["metadata"]["uid"]
        cached.pods.put(planted)
    await rec.reconcile("ns/m")
    assert _ready_nodes(cached) == set()
    # The Module's own pods do.
    for ds in cached.daemonsets.objects():
        cached.pods.put(_pod(ds, _node_of(ds)))
    await rec.reconcile("ns/m")
    assert _ready_nodes(cached) == {"n0", "n1"}


async def test_a_pod_elsewhere_does_not_hold_the_modules_deletion(world: Any) -> None:
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    loader = cached.daemonsets.objects()[0]
    cached.pods.put(_planted(_pod(loader, "n0"), "stuck"))
    cached.modules.get("ns/m")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await rec.reconcile("ns/m")  # the loader DaemonSets go (no pod of theirs)
    await rec.reconcile("ns/m")
    assert cached.modules.get("ns/m") is None  # the finalizer went
    assert ("finalizers", []) in writer.calls
    assert cached.pods.get("tenant/stuck") is not None
