"""One refusal stays local: a write the API server refuses is shown on what
it concerns (the Module's condition, the kernel's image), and the rest of
the reconcile goes ahead; the pods of a DaemonSet that admission refuses
are found (``podadmission``). Against in-memory caches and a writer whose
API server refuses what the test says, with the API server's classes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import operator_fixtures as fixtures
import pytest
from test_operator_reconciler import RecordingWriter

from kmm.api import conditions, kernels, labels
from kmm.kube import errors
from kmm.operator import caches, podadmission, reconciler, views
from kmm.operator.build import concern, existence, podnames
from kmm.operator.loader import builders as loader_builders
from kmm.runtime import stores

Obj = dict[str, Any]
K68, K61, _ = fixtures.KERNELS
NOW = "2026-01-01T00:00:00Z"
# What the API server answered kmm's server-side apply of upstream's DRA
# Module, whose env sets DRIVER_NAME, which kmm presets (before the fix).
DUPLICATE = errors.Unavailable(
    500,
    "failed to create typed patch object (ns/m-dra; apps/v1, Kind=DaemonSet): "
    '.spec.template.spec.containers[name="dra-driver"].env: duplicate entries for key '
    '[name="DRIVER_NAME"]',
    reason="InternalError",
)
QUOTA = errors.Forbidden(
    403,
    'pods "m-build-x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, '
    "limited: pods=2",
    reason="Forbidden",
)
TERMINATING = errors.Forbidden(
    403,
    'pods "m-build-x" is forbidden: unable to create new content in namespace ns because it '
    "is being terminated",
    reason="Forbidden",
)
POD_SECURITY = errors.Forbidden(
    403,
    'pods "x" is forbidden: violates PodSecurity "baseline:latest": privileged (container '
    '"module-loader" must not set securityContext.privileged=true)',
    reason="Forbidden",
)


class Refusing(RecordingWriter):
    """``refuse(kind, name)`` is the error the API server answers a write of
    that object with (None: it goes through, applied to the stores)."""

    def __init__(
        self, cached: views.Caches, refuse: Callable[[str, str], Exception | None]
    ) -> None:
        super().__init__(cached)
        self.refuse = refuse
        self.dry_runs: list[Obj] = []

    async def apply_daemonset(self, desired: dict, observed: dict | None) -> bool:
        error = self.refuse("DaemonSet", desired["metadata"]["name"])
        if error is not None:
            self.calls.append(("refused", desired["metadata"]["name"]))
            raise error
        return await super().apply_daemonset(desired, observed)

    async def create_pod(self, desired: Obj) -> bool:
        name = desired["metadata"]["name"]
        error = self.refuse("Pod", name)
        if error is not None:
            self.calls.append(("refused", name))
            raise error
        self.calls.append(("create", name))
        self.cached.pods.put(copy.deepcopy(desired))
        return True

    async def delete_pod(self, observed: Obj) -> bool:
        self.calls.append(("delete-pod", observed["metadata"]["name"]))
        self.cached.pods.delete(stores.key_of(observed))
        return True

    async def dry_run_pod(self, pod: Obj) -> None:
        self.dry_runs.append(pod)
        error = self.refuse("DryRun", pod["metadata"]["generateName"])
        if error is not None:
            raise error

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The API server's DaemonSet, template and all (the cache keeps none)."""
        assert kind == "DaemonSet"
        self.calls.append(("get", name))
        return self.cached.daemonsets.get(f"{namespace}/{name}")


def _caches() -> views.Caches:
    cached = views.Caches(
        modules=stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index}),
        daemonsets=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        pods=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
    )
    for node in (fixtures.node("n0", K68), fixtures.node("n1", K61)):
        cached.nodes.put(node)
    return cached


def _condition(cached: views.Caches, type_: str) -> Obj:
    module = cached.modules.get("ns/m")
    assert module is not None
    found: Obj = next(c for c in module["status"]["conditions"] if c["type"] == type_)
    return found


def _warnings(writer: RecordingWriter) -> list[tuple[str, str]]:
    told = ("DaemonSetRefused", "PodRefused", "ReconcileFailed")
    return [c[1] for c in writer.calls if c[0] == "event" and c[1][0] in told]


def _target(kernel: str) -> kernels.Target:
    target = kernels.target(fixtures.module(), kernel)
    assert target is not None
    return target


def _loader_name(kernel: str) -> str:
    return loader_builders.daemonset_name(fixtures.module(), kernel, _target(kernel).image)


@pytest.mark.parametrize(
    "error",
    [
        errors.Invalid(422, "spec.template.spec.containers[0].volumeMounts[0].name: Not found"),
        errors.Forbidden(403, "daemonsets.apps is forbidden: exceeded quota: daemonsets"),
        DUPLICATE,
    ],
    ids=["invalid", "forbidden", "server-error"],
)
async def test_a_refused_daemonset_degrades_the_module_and_the_others_still_go(
    error: errors.ApiError,
) -> None:
    cached = _caches()
    refused = _loader_name(K61)
    writer = Refusing(cached, lambda kind, name: error if name == refused else None)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: NOW)  # type: ignore[arg-type]
    cached.modules.put(fixtures.module_raw())
    for _ in range(3):
        result = await rec.reconcile("ns/m")
        # Asked again with the key's backoff: a freed quota sends no event.
        assert result.requeue
    # The other kernel's loader went, and so did everything after it.
    applied = [name for kind, name in writer.calls if kind == "apply"]
    assert applied == [_loader_name(K68)]
    for ds in cached.daemonsets.objects():
        cached.pods.put(fixtures.pod(ds, "n0"))
    await rec.reconcile("ns/m")
    n0 = cached.nodes.get("n0")
    assert n0 is not None
    assert labels.ready("ns", "m") in n0["metadata"]["labels"]
    degraded = _condition(cached, conditions.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", conditions.REASON_DAEMONSET_REFUSED)
    assert degraded["message"] == (
        f"the API server refused DaemonSet {refused}: {error.status}"
        f"{' ' + error.reason if error.reason else ''}: {error.message}"
    )
    ready = _condition(cached, conditions.READY)
    assert (ready["status"], ready["reason"]) == ("False", conditions.REASON_DAEMONSET_REFUSED)
    # One Warning Event for the refusal, not one per retry.
    assert _warnings(writer) == [("DaemonSetRefused", degraded["message"])]

    # The API server lets it in: Degraded goes, and a refusal again is news.
    writer.refuse = lambda kind, name: None
    result = await rec.reconcile("ns/m")
    assert not result.requeue
    assert _condition(cached, conditions.DEGRADED)["status"] == "False"
    assert len(rec._teller.told) == 0


def _building() -> concern.BuildConcern:
    """A build concern whose registry has no image (only 6.8's is built)."""

    async def missing(key: existence.Key, secret: Obj | None) -> existence.Fact:
        return existence.Fact(existence.State.MISSING)

    class Reader:
        async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
            data = {"dockerfile": "FROM scratch\n"} if kind == "ConfigMap" else {}
            return {"metadata": {"name": name, "resourceVersion": "1"}, "data": data}

    return concern.BuildConcern(existence.Checker(missing), Reader())


async def _asked(rec: reconciler.ModuleReconciler, key: str) -> None:
    """One reconcile that starts the registry checks, and their answers
    (the build concern checks beside the reconcile, never in it)."""
    assert rec.build is not None
    await rec.reconcile(key)
    await rec.build.checker.settled()


def _building_module() -> Obj:
    raw = fixtures.module_raw()
    mapping = raw["spec"]["moduleLoader"]["container"]["kernelMappings"][0]
    mapping["build"] = {"dockerfileConfigMap": {"name": "dockerfile"}}
    return raw


@pytest.mark.parametrize(
    "error", [QUOTA, TERMINATING, POD_SECURITY], ids=["quota", "terminating", "pod-security"]
)
async def test_a_refused_build_pod_is_its_kernels_and_the_other_kernels_loader_goes(
    error: errors.ApiError,
) -> None:
    cached = _caches()
    build_pod = podnames.pod_name("m", "build", K68)
    writer = Refusing(cached, lambda kind, name: error if kind == "Pod" else None)
    rec = reconciler.ModuleReconciler(
        cached,
        writer,
        now=lambda: NOW,
        build=_building(),  # type: ignore[arg-type]
    )
    cached.modules.put(_building_module())
    try:
        await _asked(rec, "ns/m")
        for _ in range(2):
            result = await rec.reconcile("ns/m")
            assert result.requeue
    finally:
        await rec.build.checker.close()  # type: ignore[union-attr]
    assert [name for kind, name in writer.calls if kind == "refused"] == [build_pod] * 2
    # 6.1's image is not built: its loader went; 6.8's waits for its image.
    assert [name for kind, name in writer.calls if kind == "apply"] == [_loader_name(K61)]
    module = cached.modules.get("ns/m")
    assert module is not None
    images = {i["kernel"]: i for i in module["status"]["images"]}
    assert images[K68]["state"] == "BuildFailed"
    message = f"the API server refused pod {build_pod}: 403 Forbidden: {error.message}"
    assert images[K68]["message"] == message
    assert "pod" not in images[K68]
    degraded = _condition(cached, conditions.DEGRADED)
    assert (degraded["reason"], degraded["message"]) == (conditions.REASON_POD_REFUSED, message)
    assert _warnings(writer) == [("PodRefused", message)]

    writer.refuse = lambda kind, name: None
    await rec.reconcile("ns/m")
    assert ("create", build_pod) in writer.calls
    module = cached.modules.get("ns/m")
    assert module is not None
    assert {i["kernel"]: i["state"] for i in module["status"]["images"]}[K68] == "Building"
    assert _condition(cached, conditions.DEGRADED)["status"] == "False"


async def test_a_transient_failure_of_a_build_pod_still_ends_the_reconcile() -> None:
    cached = _caches()
    unavailable = errors.Unavailable(503, "etcd leader changed")
    writer = Refusing(cached, lambda kind, name: unavailable if kind == "Pod" else None)
    rec = reconciler.ModuleReconciler(
        cached,
        writer,
        now=lambda: NOW,
        build=_building(),  # type: ignore[arg-type]
    )
    cached.modules.put(_building_module())
    try:
        await _asked(rec, "ns/m")  # the kernel's image known missing
        writer.calls.clear()
        with pytest.raises(errors.Unavailable):
            await rec.reconcile("ns/m")
    finally:
        await rec.build.checker.close()  # type: ignore[union-attr]
    assert "status" not in writer.kinds()


# -- the pods of a DaemonSet -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lagging(ds: Obj, desired: int, current: int) -> Obj:
    found = copy.deepcopy(ds)
    found["metadata"]["uid"] = f"uid-{ds['metadata']['name']}"
    found["status"] = {"desiredNumberScheduled": desired, "currentNumberScheduled": current}
    return found


async def test_a_daemonset_whose_pods_stay_missing_has_its_pod_tried_once_and_shown() -> None:
    cached = _caches()
    clock = Clock()
    writer = Refusing(cached, lambda kind, name: POD_SECURITY if kind == "DryRun" else None)
    admission = podadmission.PodAdmission(writer, writer, monotonic=clock)
    rec = reconciler.ModuleReconciler(
        cached,  # type: ignore[arg-type]
        writer,
        now=lambda: NOW,
        admission=admission,
        monotonic=clock,
        status_interval=0.0,
    )
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    assert writer.dry_runs == []  # nothing lags yet
    # The DaemonSet controller's creates fail: no pod, the counts stand still.
    for ds in cached.daemonsets.objects():
        cached.daemonsets.put(_lagging(ds, 1, 0))
    first = await rec.reconcile("ns/m")
    assert first.requeue_after == pytest.approx(podadmission.PATIENCE)
    assert writer.dry_runs == []  # a rollout moves the counts sooner
    clock.now += podadmission.PATIENCE
    await rec.reconcile("ns/m")
    assert len(writer.dry_runs) == 2  # each DaemonSet's template, once
    tried = {p["metadata"]["generateName"] for p in writer.dry_runs}
    assert tried == {f"{_loader_name(K68)}-", f"{_loader_name(K61)}-"}
    template = cached.daemonsets.get(f"ns/{_loader_name(K68)}")
    assert template is not None
    pod = next(
        p for p in writer.dry_runs if p["metadata"]["generateName"].startswith(_loader_name(K68))
    )
    assert pod["spec"] == template["spec"]["template"]["spec"]
    assert pod["metadata"]["labels"] == template["spec"]["template"]["metadata"]["labels"]
    degraded = _condition(cached, conditions.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", conditions.REASON_POD_REFUSED)
    assert (
        f"the pods of DaemonSet {_loader_name(K68)} are refused: 403 Forbidden: "
        in degraded["message"]
    )
    assert 'violates PodSecurity "baseline:latest"' in degraded["message"]
    warned = [m for reason, m in _warnings(writer) if reason == "PodRefused"]
    assert len(warned) == 2

    # Looked at again (a resync): nothing asked, nothing told again.
    for _ in range(3):
        clock.now += 60
        await rec.reconcile("ns/m")
    assert len(writer.dry_runs) == 2
    assert sorted(c for c in writer.calls if c[0] == "get") == sorted(
        ("get", name.removesuffix("-")) for name in tried
    )
    assert len([m for reason, m in _warnings(writer) if reason == "PodRefused"]) == 2

    # The namespace allows them now: the controller makes the pods.
    for ds in cached.daemonsets.objects():
        cached.daemonsets.put(_lagging(ds, 1, 1))
    await rec.reconcile("ns/m")
    assert _condition(cached, conditions.DEGRADED)["status"] == "False"
    assert len(admission) == 0


async def test_an_admitted_pod_and_a_moving_rollout_show_nothing() -> None:
    cached = _caches()
    clock = Clock()
    writer = Refusing(cached, lambda kind, name: None)
    admission = podadmission.PodAdmission(writer, writer, monotonic=clock)
    ds = _lagging(loader_builders.daemonset(fixtures.module(), _target(K68)), 5, 0)
    for current in (1, 2, 3, 4):  # the counts move within the patience
        ds = _lagging(ds, 5, current)
        clock.now += podadmission.PATIENCE / 2
        checked = await admission.refusals("ns/m", [ds])
        assert checked.refused == {}
    assert writer.dry_runs == []
    cached.daemonsets.put(ds)
    clock.now += podadmission.PATIENCE
    checked = await admission.refusals("ns/m", [ds])  # stuck at 4/5: tried, admitted
    assert checked.refused == {}
    assert len(writer.dry_runs) == 1
    clock.now += podadmission.PATIENCE
    await admission.refusals("ns/m", [ds])
    assert len(writer.dry_runs) == 1  # the same numbers: the answer stands
    # A node joins while the lag stands: asked again once its counts stand still.
    grown = _lagging(ds, 6, 4)
    cached.daemonsets.put(grown)
    assert (await admission.refusals("ns/m", [grown])).requeue_after == pytest.approx(
        podadmission.PATIENCE
    )
    clock.now += podadmission.PATIENCE
    await admission.refusals("ns/m", [grown])
    assert len(writer.dry_runs) == 2


async def test_a_transient_failure_of_the_dry_run_is_raised_and_asked_again() -> None:
    cached = _caches()
    clock = Clock()
    flaky = [errors.Unavailable(0, "connection refused")]
    writer = Refusing(
        cached, lambda kind, name: flaky.pop() if flaky and kind == "DryRun" else None
    )
    admission = podadmission.PodAdmission(writer, writer, monotonic=clock, patience=0.0)
    ds = _lagging(loader_builders.daemonset(fixtures.module(), _target(K68)), 1, 0)
    cached.daemonsets.put(ds)
    with pytest.raises(errors.Unavailable):
        await admission.refusals("ns/m", [ds])
    assert (await admission.refusals("ns/m", [ds])).refused == {}
    assert len(writer.dry_runs) == 2
