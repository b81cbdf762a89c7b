"""The Module reconciler against in-memory caches and a recording writer."""

from __future__ import annotations

import asyncio
from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.aio import clocks
from kmm.api import conditions, labels
from kmm.kube import errors
from kmm.operator import caches, failures, inflight, labelling, reconciler, views
from kmm.operator.build import asking, existence
from kmm.operator.build import concern as build_concern
from kmm.operator.loader import planner as loader_planner
from kmm.runtime import controllers, stores, workqueue

K68, K61, KEL9 = fixtures.KERNELS


class RecordingWriter:
    """The writer's interface; every call recorded, results applied to the stores."""

    def __init__(self, cached: views.Caches) -> None:
        self.cached = cached
        self.calls: list[tuple[str, Any]] = []
        self.pending = inflight.Pending()

    async def apply_daemonset(self, desired: dict, observed: dict | None) -> bool:
        name = desired["metadata"]["name"]
        self.calls.append(("apply", name))
        # As the API server: the object keeps its uid, a new one gets one.
        uid = (observed or {}).get("metadata", {}).get("uid") or f"uid-ds-{name}"
        self.cached.daemonsets.put({**desired, "metadata": {**desired["metadata"], "uid": uid}})
        return observed is None

    async def delete_daemonset(self, observed: dict) -> bool:
        metadata = observed["metadata"]
        assert metadata["uid"], "a delete is guarded by the observed uid"
        self.calls.append(("delete", metadata["name"]))
        self.cached.daemonsets.delete(f"{metadata['namespace']}/{metadata['name']}")
        return True

    async def patch_node_labels(self, node: dict, change: dict) -> bool:
        self.calls.append(("labels", (node["metadata"]["name"], change)))
        updated = {**node, "metadata": {**node["metadata"]}}
        current = dict(updated["metadata"].get("labels") or {})
        for key, value in change.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        updated["metadata"]["labels"] = current
        self.cached.nodes.put(updated)
        return True

    async def patch_module_status(self, module: dict, patch: dict) -> bool:
        self.calls.append(("status", patch))
        key = f"{module['metadata']['namespace']}/{module['metadata']['name']}"
        current = self.cached.modules.get(key)
        assert current is not None
        self.cached.modules.put({**current, "status": patch["status"]})
        return True

    async def set_finalizers(self, module: dict, finalizers: list[str]) -> None:
        self.calls.append(("finalizers", finalizers))
        key = f"{module['metadata']['namespace']}/{module['metadata']['name']}"
        current = self.cached.modules.get(key)
        assert current is not None
        metadata = {**current["metadata"], "finalizers": finalizers}
        if not finalizers and metadata.get("deletionTimestamp"):
            self.cached.modules.delete(key)
        else:
            self.cached.modules.put({**current, "metadata": metadata})

    async def create_event(self, event: dict) -> None:
        self.calls.append(("event", (event["reason"], event["message"])))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


@pytest.fixture
def world() -> tuple[reconciler.ModuleReconciler, RecordingWriter, views.Caches]:
    cached = views.Caches(
        modules=stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index}),
        daemonsets=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        pods=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
    )
    for node in (
        fixtures.node("n0", K68),
        fixtures.node("n1", K61),
        fixtures.node("x", K68, pick=False),
    ):
        cached.nodes.put(node)
    writer = RecordingWriter(cached)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    return rec, writer, cached


async def test_converges_then_a_resync_writes_nothing(world: Any) -> None:
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    assert writer.kinds().count("apply") == 2
    assert [c[1][0] for c in writer.calls if c[0] == "event"] == ["DaemonSetCreated"] * 2
    # Pods come up Ready: the .ready labels follow.
    for ds in cached.daemonsets.objects():
        node = "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"
        cached.pods.put(fixtures.pod(ds, node))
    await rec.reconcile("ns/m")
    ready_key = labels.ready("ns", "m")
    assert {
        n["metadata"]["name"]
        for n in cached.nodes.objects()
        if ready_key in n["metadata"]["labels"]
    } == {"n0", "n1"}
    module = cached.modules.get("ns/m")
    ready = next(c for c in module["status"]["conditions"] if c["type"] == conditions.READY)
    assert ready["status"] == "True"

    writer.calls.clear()
    await rec.reconcile("ns/m")
    await rec.reconcile("ns/m")
    assert writer.calls == []


def _untagged_image(container: dict[str, Any]) -> None:
    container["kernelMappings"][0]["containerImage"] = "r.io/no-tag"


def _raw_load_only(container: dict[str, Any]) -> None:
    # Once admitted and validated, then failing an assert in the loader
    # builder on every reconcile: no status, no Event, retried forever.
    container["modprobe"] = {"rawArgs": {"load": ["-v", "kmod_x"]}}


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (_untagged_image, "kernelMappings[0].containerImage"),
        (_raw_load_only, "modprobe: rawArgs.load and rawArgs.unload must both be set"),
    ],
    ids=["untagged-image", "raw-args-load-only"],
)
async def test_invalid_module_is_degraded_with_one_event_and_nothing_made(
    world: Any, mutate: Any, fragment: str
) -> None:
    rec, writer, cached = world
    raw = fixtures.module_raw()
    mutate(raw["spec"]["moduleLoader"]["container"])
    cached.modules.put(raw)
    await rec.reconcile("ns/m")
    assert writer.kinds() == ["status", "event"]
    degraded = next(
        c for c in writer.calls[0][1]["status"]["conditions"] if c["type"] == conditions.DEGRADED
    )
    assert degraded["reason"] == conditions.REASON_INVALID_SPEC
    assert fragment in degraded["message"]
    assert writer.calls[1][1][0] == "InvalidSpec"
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert writer.calls == []
    assert cached.daemonsets.objects() == []


async def test_finalizer_added_and_labels_cleaned_on_delete(world: Any) -> None:
    rec, writer, cached = world
    raw = fixtures.module_raw()
    raw["metadata"]["finalizers"] = []
    cached.modules.put(raw)
    await rec.reconcile("ns/m")
    assert writer.calls[0] == ("finalizers", [labels.FINALIZER])
    for ds in cached.daemonsets.objects():
        node = "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"
        cached.pods.put(fixtures.pod(ds, node))
    await rec.reconcile("ns/m")
    current = cached.modules.get("ns/m")
    current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    writer.calls.clear()
    await rec.reconcile("ns/m")
    # The loader DaemonSets go first; .ready and the finalizer stay while
    # their pods unload (preStop) on their way out.
    assert writer.kinds() == ["delete", "event", "delete", "event"]
    ready_key = labels.ready("ns", "m")
    assert {n["metadata"]["name"] for n in cached.nodes.objects()
            if ready_key in n["metadata"]["labels"]} == {"n0", "n1"}  # fmt: skip
    assert cached.modules.get("ns/m") is not None
    for pod in cached.pods.objects():
        cached.pods.delete(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert writer.kinds() == ["labels", "labels", "finalizers"]
    assert not any(ready_key in n["metadata"]["labels"] for n in cached.nodes.objects())
    assert cached.modules.get("ns/m") is None


async def test_a_deleted_module_unloads_only_once_its_device_plugin_pods_are_gone(
    world: Any,
) -> None:
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw(devicePlugin={"container": {"image": "r.io/p:1"}}))
    for _ in range(3):  # loader pods Ready, then the device plugin's
        await rec.reconcile("ns/m")
        for ds in cached.daemonsets.objects():
            for node in ("n0", "n1"):
                cached.pods.put(fixtures.pod(ds, node))
    roles = {
        ds["metadata"]["name"]: ds["metadata"]["labels"][labels.ROLE]
        for ds in cached.daemonsets.objects()
    }
    assert sorted(roles.values()) == ["device-plugin", "module-loader", "module-loader"]
    cached.modules.get("ns/m")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    writer.calls.clear()
    await rec.reconcile("ns/m")
    # The device plugin's DaemonSet only: its pods still use the module.
    deleted = [roles[name] for kind, name in writer.calls if kind == "delete"]
    assert deleted == ["device-plugin"]
    for pod in cached.pods.objects():
        if pod["metadata"]["labels"][labels.ROLE] == "device-plugin":
            cached.pods.delete(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    writer.calls.clear()
    await rec.reconcile("ns/m")
    deleted = [roles[name] for kind, name in writer.calls if kind == "delete"]
    assert deleted == ["module-loader", "module-loader"]
    assert "finalizers" not in writer.kinds()


async def test_node_leaving_the_selector_loses_label_and_pair(world: Any) -> None:
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    for ds in cached.daemonsets.objects():
        node = "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"
        cached.pods.put(fixtures.pod(ds, node))
    await rec.reconcile("ns/m")
    n1 = cached.nodes.get("n1")
    cached.nodes.put({**n1, "metadata": {**n1["metadata"], "labels": {
        k: v for k, v in n1["metadata"]["labels"].items() if k != "pick"
    }}})  # fmt: skip
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert writer.kinds()[:2] == ["delete", "event"]
    assert ("labels", ("n1", {labels.ready("ns", "m"): None})) in writer.calls


async def test_labels_of_a_vanished_module_are_removed(world: Any) -> None:
    rec, writer, cached = world
    stray = fixtures.node("n9", K68, extra={labels.ready("ns", "gone"): ""})
    cached.nodes.put(stray)
    await rec.reconcile("ns/gone")
    assert writer.calls == [("labels", ("n9", {labels.ready("ns", "gone"): None}))]


def test_pending_skips_a_repeat_until_the_cache_shows_the_result() -> None:
    pending = inflight.Pending()
    pending.sent("n1", "labels", {"a": ""}, "7")
    assert pending.in_flight("n1", "labels", "5", {"a": ""})
    assert not pending.in_flight("n1", "labels", "5", {"a": None})
    pending.seen("n1", "6")  # someone else's update, before ours landed
    assert pending.in_flight("n1", "labels", "6", {"a": ""})
    pending.seen("n1", "7")
    assert not pending.in_flight("n1", "labels", "6", {"a": ""})
    assert len(pending) == 0
    pending.sent("ds", "delete", None, str(2**63))
    pending.seen("ds", "9")
    assert pending.in_flight("ds", "delete", "9", None)
    pending.seen("ds", None)
    assert len(pending) == 0


async def test_counts_only_status_changes_wait_for_the_interval(world: Any) -> None:
    rec, writer, cached = world
    clock = [100.0]
    rec.monotonic = lambda: clock[0]
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")  # first status: written
    daemonsets = sorted(cached.daemonsets.objects(), key=lambda d: d["metadata"]["name"])
    daemonsets[0]["status"] = {"desiredNumberScheduled": 1}
    writer.calls.clear()
    result = await rec.reconcile("ns/m")
    assert writer.calls == []
    assert result.requeue_after == pytest.approx(1.0)
    clock[0] += 1.0
    await rec.reconcile("ns/m")
    assert writer.kinds() == ["status"]


def _run_pods(cached: views.Caches) -> None:
    for ds in cached.daemonsets.objects():
        node = "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"
        cached.pods.put(fixtures.pod(ds, node))


async def test_node_events_when_the_module_is_loaded_and_unloaded(world: Any) -> None:
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    _run_pods(cached)
    writer.calls.clear()
    await rec.reconcile("ns/m")
    loaded = [c[1] for c in writer.calls if c[0] == "event"]
    assert loaded == [("ModuleLoaded", "module ns/m loaded")] * 2
    for pod in cached.pods.objects():
        if pod["spec"]["nodeName"] == "n1":
            cached.pods.delete(stores.key_of(pod))
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert [c[1] for c in writer.calls if c[0] == "event"] == [
        ("ModuleUnloaded", "module ns/m unloaded")
    ]


async def test_a_stale_view_does_not_repeat_a_label_write(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconcile plans from the view it took at its start; when another
    write landed in the cache since, the patch it would repeat is not sent."""
    rec, writer, cached = world
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    _run_pods(cached)
    stale = {n["metadata"]["name"]: n for n in cached.nodes.objects()}
    await rec.reconcile("ns/m")  # writes .ready on n0 and n1
    build = views.build

    def stale_view(raw: Any, module: Any, **kwargs: Any) -> views.ModuleView:
        old = stores.Store()
        for node in stale.values():
            old.put(node)
        # Nothing carried the Module's labels yet, as far as the stale view knows.
        return build(raw, module, **{**kwargs, "nodes": old, "labelled": []})

    monkeypatch.setattr(views, "build", stale_view)
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert [c for c in writer.calls if c[0] == "labels"] == []


class RaisingPlanner:
    """``loader.planner.plan`` made to raise ``errors[i]`` on its i-th call, then plan."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.real = loader_planner.plan

    def __call__(self, view: views.ModuleView, **options: Any) -> loader_planner.LoaderPlan:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.real(view, **options)


def _condition(cached: views.Caches, type_: str) -> dict[str, Any]:
    module = cached.modules.get("ns/m")
    assert module is not None
    found: dict[str, Any] = next(c for c in module["status"]["conditions"] if c["type"] == type_)
    return found


def _warnings(writer: RecordingWriter) -> list[tuple[str, str]]:
    return [c[1] for c in writer.calls if c[0] == "event" and c[1][0] == "ReconcileFailed"]


async def test_a_raising_planner_degrades_the_module_with_one_event_per_message(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, writer, cached = world
    boom = RuntimeError("boom")
    planner = RaisingPlanner(boom, boom, boom, KeyError("kernel"), KeyError("kernel"))
    monkeypatch.setattr(loader_planner, "plan", planner)
    cached.modules.put(fixtures.module_raw())
    for _ in range(3):
        with pytest.raises(Exception, match="boom"):
            await rec.reconcile("ns/m")
    degraded = _condition(cached, conditions.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", conditions.REASON_RECONCILE_FAILED)
    assert degraded["message"] == "planning the module loader: RuntimeError: boom"
    assert _warnings(writer) == [("ReconcileFailed", degraded["message"])]
    assert writer.kinds().count("status") == 1  # the same failure: written once
    # Another failure: its own Event, once.
    for _ in range(2):
        with pytest.raises(Exception, match="kernel"):
            await rec.reconcile("ns/m")
    assert _condition(cached, conditions.DEGRADED)["message"] == (
        "planning the module loader: KeyError: 'kernel'"
    )
    assert [m for _, m in _warnings(writer)] == [
        "planning the module loader: RuntimeError: boom",
        "planning the module loader: KeyError: 'kernel'",
    ]
    # The fault gone: the Module converges and Degraded goes back.
    await rec.reconcile("ns/m")
    assert planner.calls == 6
    degraded = _condition(cached, conditions.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("False", conditions.REASON_AS_EXPECTED)
    assert writer.kinds().count("apply") == 2
    # Recovered, the memory of the last failure is gone: the same failure
    # again is news, and gets its Event.
    planner.errors = [boom]
    with pytest.raises(Exception, match="boom"):
        await rec.reconcile("ns/m")
    assert len(_warnings(writer)) == 3


async def test_the_failure_memory_goes_with_the_module(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, writer, cached = world
    monkeypatch.setattr(loader_planner, "plan", RaisingPlanner(*[RuntimeError("boom")] * 2))
    cached.modules.put(fixtures.module_raw())
    with pytest.raises(Exception, match="boom"):
        await rec.reconcile("ns/m")
    assert rec._shown == {"ns/m": "planning the module loader: RuntimeError: boom"}
    cached.modules.delete("ns/m")
    await rec.reconcile("ns/m")
    assert rec._shown == {}
    cached.modules.put(fixtures.module_raw())  # made again, failing the same way
    with pytest.raises(Exception, match="boom"):
        await rec.reconcile("ns/m")
    assert len(_warnings(writer)) == 2


class RefusingWriter(RecordingWriter):
    """The API server refuses the DaemonSets kmm sends, with ``error``."""

    def __init__(self, cached: views.Caches, error: Exception) -> None:
        super().__init__(cached)
        self.error = error

    async def apply_daemonset(self, desired: dict, observed: dict | None) -> bool:
        self.calls.append(("apply", desired["metadata"]["name"]))
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        errors.Conflict(409, "the object has been modified"),
        errors.Unavailable(503, "etcd leader changed"),
        errors.Throttled(429, "slow down"),
        errors.Fenced("PATCH", "/apis/apps/v1/daemonsets"),
    ],
    ids=["conflict", "unavailable", "throttled", "fenced"],
)
async def test_a_transient_failure_is_retried_without_degrading(
    world: Any, error: Exception
) -> None:
    _, _, cached = world
    writer = RefusingWriter(cached, error)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    cached.modules.put(fixtures.module_raw())
    with pytest.raises(type(error)) as raised:
        await rec.reconcile("ns/m")
    assert raised.value is error
    assert "status" not in writer.kinds()
    assert _warnings(writer) == []


async def test_a_long_failure_message_is_bounded(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, writer, cached = world
    monkeypatch.setattr(loader_planner, "plan", RaisingPlanner(ValueError("x" * 5000)))
    cached.modules.put(fixtures.module_raw())
    with pytest.raises(Exception, match="xxx"):
        await rec.reconcile("ns/m")
    message = _condition(cached, conditions.DEGRADED)["message"]
    assert len(message) <= failures.MAX_MESSAGE
    assert message.startswith("planning the module loader: ValueError: xxx")
    assert message.endswith("…")
    assert _warnings(writer) == [("ReconcileFailed", message)]


async def test_a_failing_module_is_retried_with_backoff_until_it_converges(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real controller: each failure is retried after the key's
    growing backoff; the Module converges on the first success."""
    rec, writer, cached = world
    planner = RaisingPlanner(*[RuntimeError("boom")] * 3)
    monkeypatch.setattr(loader_planner, "plan", planner)
    cached.modules.put(fixtures.module_raw())
    clock = clocks.FakeClock()
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(
        "module", clock, backoff=workqueue.ItemBackoff(base=1.0, max_delay=60.0)
    )
    controller = controllers.Controller("module", rec, queue=queue, clock=clock)
    controller.enqueue("ns/m")
    await controller.process_one()
    for failures_so_far, delay in ((1, 1.0), (2, 2.0), (3, 4.0)):
        assert queue.failures("ns/m") == failures_so_far
        clock.advance(delay - 0.001)
        assert len(queue) == 0  # not before its backoff
        clock.advance(0.001)
        assert len(queue) == 1
        await controller.process_one()
    assert planner.calls == 4
    assert queue.failures("ns/m") == 0  # success forgot the backoff
    assert _condition(cached, conditions.DEGRADED)["status"] == "False"
    assert len(_warnings(writer)) == 1


class DownWriter(RecordingWriter):
    """Node patches meet an API server that does not answer while ``down``
    (each in flight until the loop turns, as a real request is)."""

    def __init__(self, cached: views.Caches) -> None:
        super().__init__(cached)
        self.down = True
        self.patches = 0

    async def patch_node_labels(self, node: dict, change: dict) -> bool:
        self.patches += 1
        await asyncio.sleep(0)
        if self.down:
            raise errors.Unavailable(0, "ClientConnectorError: connection refused")
        return await super().patch_node_labels(node, change)


async def test_an_outage_costs_the_patches_in_flight_not_one_per_node(world: Any) -> None:
    _, _, cached = world
    for index in range(100):
        cached.nodes.put(fixtures.node(f"w{index:03}", K68))
    writer = DownWriter(cached)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    cached.modules.put(fixtures.module_raw())
    for retry in range(1, 4):
        with pytest.raises(errors.Unavailable):
            await rec.reconcile("ns/m")
        # Each retry sends what was in flight when the first patch failed.
        assert writer.patches == retry * labelling._PARALLEL_WRITES
    writer.down = False
    await rec.reconcile("ns/m")
    kernel = labels.KERNEL_VERSION_FULL
    labelled = [n for n in cached.nodes.objects() if kernel in n["metadata"]["labels"]]
    assert len(labelled) == 102  # every selected node (x is not)


class _Inputs:
    """GETs of the ConfigMaps and Secrets build pods read: all exist."""

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "resourceVersion": "1"}, "data": {}}


async def test_a_black_holed_registry_holds_no_module_reconcile(world: Any) -> None:
    """A Module whose images point at a registry that accepts connections
    and never answers: the reconcile returns at once with its kernels
    Checking, no pod made, while the checks wait in the background (counted:
    the black hole's connections, the reconciles that returned)."""
    rec, writer, cached = world
    connected = asyncio.Event()
    connections: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, peer: asyncio.StreamWriter) -> None:
        connections.append(peer)  # never answered
        connected.set()

    hole = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = hole.sockets[0].getsockname()[1]
    asker = asking.Asker(endpoints={"black.hole:5000": f"127.0.0.1:{port}"}, timeout=300)
    checker = existence.Checker(asker)
    rec.build = build_concern.BuildConcern(checker, _Inputs())  # type: ignore[arg-type]
    requeued: list[str] = []
    rec.build.enqueue = requeued.append
    raw = fixtures.module_raw()
    container = raw["spec"]["moduleLoader"]["container"]
    container["build"] = {"dockerfileConfigMap": {"name": "dockerfile"}}
    for mapping in container["kernelMappings"]:
        mapping["containerImage"] = "black.hole:5000/m:${KERNEL_XYZ}"
    cached.modules.put(raw)
    try:
        reconciling = asyncio.ensure_future(rec.reconcile("ns/m"))
        await connected.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        assert reconciling.done(), "the reconcile waits for the registry"
        result = reconciling.result()
        assert result.requeue_after is not None  # a safety net, not a wait
        status = cached.modules.get("ns/m")["status"]
        assert {i["state"] for i in status["images"]} == {"Checking"}
        assert "apply" not in writer.kinds()  # the gated kernels get no loader yet
        assert checker.running() == 2
        assert len(connections) >= 1
        # Reconciled again meanwhile: nothing new is asked.
        await rec.reconcile("ns/m")
        assert checker.running() == 2
        assert requeued == []
    finally:
        await checker.close()
        for peer in connections:
            peer.close()
        hole.close()
        await hole.wait_closed()


class _Table:
    """``existence.Ask``: every image exists; what was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, key: existence.Key, secret: dict[str, Any] | None) -> existence.Fact:
        self.asked.append(key.image)
        return existence.Fact(existence.State.EXISTS)


async def test_an_image_only_one_kernel_expands_wrongly_is_that_kernels_status(
    world: Any,
) -> None:
    """Admitted (its literal parts are a reference), the image expands for
    one node's kernel to a name no registry takes ('+' in a path): that
    kernel is the Module's KernelMappingFailed; the other kernel is checked
    and gets its loader. Nothing raises out of the reconcile."""
    rec, writer, cached = world
    rec.status_interval = 0.0  # every status change written at once
    cached.nodes.put(fixtures.node("n1", "6.1.0+rt-1"))  # KERNEL_Z = "0+rt"
    table = _Table()
    checker = existence.Checker(table)
    rec.build = build_concern.BuildConcern(checker, _Inputs())  # type: ignore[arg-type]
    raw = fixtures.module_raw()
    container = raw["spec"]["moduleLoader"]["container"]
    container["build"] = {"dockerfileConfigMap": {"name": "dockerfile"}}
    container["kernelMappings"] = [{"regexp": "^.+$", "containerImage": "r.io/m-${KERNEL_Z}/x:v1"}]
    cached.modules.put(raw)
    try:
        await rec.reconcile("ns/m")
        await checker.settled()
        await rec.reconcile("ns/m")
    finally:
        await checker.close()
    assert table.asked == ["r.io/m-0/x:v1"]
    status = cached.modules.get("ns/m")["status"]
    assert [(i["kernel"], i["state"]) for i in status["images"]] == [(K68, "Exists")]
    degraded = next(c for c in status["conditions"] if c["type"] == conditions.DEGRADED)
    assert degraded["status"] == "True"
    assert "6.1.0+rt-1" in degraded["message"]
    assert "image reference" in degraded["message"]
    assert writer.kinds().count("apply") == 1
