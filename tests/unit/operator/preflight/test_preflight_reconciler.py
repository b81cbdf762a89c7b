"""The preflight reconciler's I/O policy: what it asks registries and the
API server, what it writes, and when nothing (a checker whose registry is a
table, a writer that records and applies to the stores)."""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import json
from typing import Any

import pytest
import test_preflight_planner as cases

from kmm.api import labels, preflight
from kmm.kube import errors
from kmm.operator import caches
from kmm.operator.build import existence, podnames
from kmm.operator.preflight import reconciler
from kmm.runtime import stores

Obj = dict[str, Any]
UNSIGNED = "r.io/unsigned:6.8.0-45-generic"


class _Checker(existence.Checker):
    """A checker whose registry is a table (``images``)."""

    def __init__(self, images: dict[str, existence.State], **more: Any) -> None:
        super().__init__(self._table, **more)
        self.images = images
        self.asked: collections.Counter[str] = collections.Counter()

    async def _table(self, key: existence.Key, secret: Obj | None) -> existence.Fact:
        self.asked[key.image] += 1
        return existence.Fact(self.images.get(key.image, existence.State.MISSING))


class _Reader:
    def __init__(self) -> None:
        self.gets: list[tuple[str, str, str]] = []
        self.versions: dict[str, str] = {}

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        self.gets.append((kind, namespace, name))
        data = {"dockerfile": "FROM scratch\n"} if kind == "ConfigMap" else {}
        version = self.versions.get(f"{kind}/{name}", "1")
        return {"metadata": {"name": name, "resourceVersion": version}, "data": data}


class _Writer:
    """The writer's calls the reconciler makes; each applied to the stores,
    with ``writing.Writer``'s answers: a create of a name taken is False
    (AlreadyExists), a delete of a pod gone is False, and a create in a
    namespace listed in ``refusing`` raises that namespace's refusal (the
    API server's error class; nothing is made)."""

    def __init__(self, validations: stores.Store, pod_store: stores.Store) -> None:
        self.validations = validations
        self.pods = pod_store
        self.calls: list[tuple[str, str]] = []
        self.refusing: dict[str, errors.ApiError] = {}
        self._uids = itertools.count()

    async def create_pod(self, desired: Obj) -> bool:
        metadata = desired["metadata"]
        refusal = self.refusing.get(metadata["namespace"])
        if refusal is not None:
            self.calls.append(("refused", metadata["name"]))
            raise refusal
        self.calls.append(("create", metadata["name"]))
        if self.pods.get(stores.key_of(desired)) is not None:
            return False
        made = copy.deepcopy(desired)
        made["metadata"]["uid"] = f"pod-{next(self._uids)}"
        made["status"] = {"phase": "Pending"}
        self.pods.put(made)
        return True

    async def delete_pod(self, observed: Obj) -> bool:
        self.calls.append(("delete", observed["metadata"]["name"]))
        if self.pods.get(stores.key_of(observed)) is None:
            return False
        self.pods.delete(stores.key_of(observed))
        return True

    async def patch_preflight_status(self, found: Obj, patch: Obj) -> bool:
        self.calls.append(("status", found["metadata"]["name"]))
        current = self.validations.get(found["metadata"]["name"])
        assert current is not None
        self.validations.put({**current, "status": copy.deepcopy(patch["status"])})
        return True


class World:
    def __init__(self, images: dict[str, existence.State] | None = None) -> None:
        self.validations = stores.Store()
        self.modules = stores.Store()
        self.pods = stores.Store(indexers={caches.PREFLIGHT_INDEX: caches.preflight_index})
        self.writer = _Writer(self.validations, self.pods)
        self.clock = [100.0]
        self.checker = _Checker(images or {}, clock=lambda: self.clock[0])
        self.reader = _Reader()
        self.times = iter(f"2026-12-02T12:00:{s:02d}Z" for s in range(60))
        self.requeued: list[str] = []
        self.reconciler = reconciler.PreflightReconciler(
            self.validations,
            self.modules,
            self.pods,
            self.writer,  # type: ignore[arg-type]
            checker=self.checker,
            reader=self.reader,
            settings=cases.SETTINGS,
            now=lambda: next(self.times),
            monotonic=lambda: self.clock[0],
            enqueue=self.requeued.append,
        )

    async def reconcile(self, name: str = "pfv") -> Any:
        """A reconcile and, while it started registry checks, another once
        they answered (the requeue the checker asks for)."""
        for _ in range(4):  # a reconcile that asks on every round never settles
            result = await self.reconciler.reconcile(name)
            if not self.checker.running():
                return result
            await self.checker.settled()
            assert set(self.requeued) == {name}, self.requeued
            self.requeued.clear()
        raise AssertionError("the reconcile keeps asking the registry")

    def status(self, name: str = "pfv") -> dict[str, Obj]:
        found = self.validations.get(name) or {}
        return {
            f"{e['namespace']}/{e['name']}": e
            for e in (found.get("status") or {}).get("modules") or ()
        }

    def finish(self, phase: str, message: str = "") -> None:
        """Every preflight pod ends in ``phase``."""
        code = 0 if phase == "Succeeded" else 1
        ended = {"terminated": {"exitCode": code, "message": message}}
        for pod in self.pods.objects():
            found = copy.deepcopy(pod)
            found["status"] = {"phase": phase, "containerStatuses": [{"name": "c", "state": ended}]}
            self.pods.put(found)


async def test_three_modules_then_a_converged_validation_asks_and_writes_nothing() -> None:
    world = World({cases.IMAGE: existence.State.EXISTS})
    world.modules.put(cases.module_raw("exists"))
    world.modules.put(cases.module_raw("builds", "other", build=True, sign=True))
    unmapped = cases.module_raw("unmapped")
    unmapped["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["literal"] = "1.2.3"
    world.modules.put(unmapped)
    world.checker.images["r.io/m:6.8.0-45-generic"] = existence.State.EXISTS
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    verdicts = world.status()
    assert {k: v["verificationStatus"] for k, v in verdicts.items()} == {
        "ns/exists": "Success",
        "ns/unmapped": "Failure",
        "other/builds": "Success",  # the same image name exists
    }
    assert verdicts["ns/unmapped"]["statusReason"] == preflight.REASON_MAPPING_NOT_FOUND
    # InProgress while the registry was asked, then the verdicts.
    assert world.writer.calls == [("status", "pfv")] * 2
    asked = dict(world.checker.asked)
    for _ in range(3):
        await world.reconcile()
    assert world.writer.calls == [("status", "pfv")] * 2
    assert world.checker.asked == asked
    # The image existed: no ConfigMap was read, only the repo Secrets for the asks.
    assert all(kind == "Secret" for kind, _, _ in world.reader.gets)


async def test_a_build_runs_once_then_its_pod_is_the_verdict() -> None:
    world = World()
    world.modules.put(cases.module_raw(build=True))
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    name = podnames.preflight_pod_name("pfv", "m")
    made = [("status", "pfv"), ("create", name), ("status", "pfv")]
    assert world.writer.calls == made  # InProgress while checking, then with its pod
    first = world.status()["ns/m"]
    assert (first["verificationStatus"], first["pod"]) == ("InProgress", name)
    await world.reconcile()
    assert world.writer.calls == made  # running: nothing new
    world.finish("Succeeded", json.dumps({"pushed": False}))
    await world.reconcile()
    done = world.status()["ns/m"]
    assert done["verificationStatus"] == "Success"
    assert done["statusReason"].endswith("(pushBuiltImage is false)")
    assert done["lastTransitionTime"] != first["lastTransitionTime"]
    calls, asked = len(world.writer.calls), dict(world.checker.asked)
    for _ in range(3):
        result = await world.reconcile()
        assert result.requeue_after is None
    assert len(world.writer.calls) == calls
    assert world.checker.asked == asked == {cases.IMAGE: 1}


async def test_a_failed_build_is_kept_until_an_input_changes() -> None:
    world = World()
    world.modules.put(cases.module_raw(build=True))
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    world.finish("Failed", "kmm-build: error: buildah build failed")
    result = await world.reconcile()
    failed = world.status()["ns/m"]
    assert failed["verificationStatus"] == "Failure"
    assert "buildah build failed" in failed["statusReason"]
    assert result.requeue_after == cases.SETTINGS.poll
    creates = [c for c in world.writer.calls if c[0] == "create"]
    for _ in range(3):
        await world.reconcile()
    assert [c for c in world.writer.calls if c[0] == "create"] == creates
    world.reader.versions["ConfigMap/dockerfile"] = "2"  # the Dockerfile fixed
    await world.reconcile()
    assert world.writer.calls[-2:] == [
        ("delete", podnames.preflight_pod_name("pfv", "m")),
        ("status", "pfv"),
    ]
    await world.reconcile()
    assert world.writer.calls[-2:] == [
        ("create", podnames.preflight_pod_name("pfv", "m")),
        ("status", "pfv"),
    ]
    assert world.status()["ns/m"]["verificationStatus"] == "InProgress"


async def test_a_deleted_module_leaves_the_status_with_its_pod_and_a_new_one_joins() -> None:
    world = World({cases.IMAGE: existence.State.EXISTS})
    world.modules.put(cases.module_raw("gone", build=True))
    world.checker.images.pop(cases.IMAGE)
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    assert set(world.status()) == {"ns/gone"}
    world.modules.delete("ns/gone")
    world.modules.put(cases.module_raw("new"))
    await world.reconcile()
    assert set(world.status()) == {"ns/new"}
    assert ("delete", podnames.preflight_pod_name("pfv", "gone")) in world.writer.calls
    assert world.pods.objects() == []


async def test_a_pushed_image_is_forgotten_once_per_pod() -> None:
    world = World()
    world.modules.put(cases.module_raw(build=True))
    world.validations.put(cases.validation_raw(push=True))
    await world.reconcile()
    world.finish("Succeeded", json.dumps({"pushed": True}))
    key = existence.Key(cases.IMAGE, secret="ns/repo")
    assert world.checker.known(key) is not None
    await world.reconcile()
    assert world.checker.known(key) is None  # the build concern asks again
    world.checker.fact(key, world.reconciler._secret)
    await world.checker.settled()
    await world.reconcile()
    assert world.checker.known(key) is not None  # once


async def test_a_missing_unsigned_image_is_asked_again_every_poll() -> None:
    world = World()
    world.modules.put(cases.module_raw(sign=True))
    world.validations.put(cases.validation_raw())
    for _ in range(2):  # within a poll: remembered
        result = await world.reconcile()
        assert result.requeue_after == cases.SETTINGS.poll
    assert world.checker.asked == {cases.IMAGE: 1, UNSIGNED: 1}
    for asked in (2, 3):
        world.clock[0] += cases.SETTINGS.poll
        await world.reconcile()
        assert world.checker.asked == {cases.IMAGE: 1, UNSIGNED: asked}
    assert "sign.unsignedImage" in world.status()["ns/m"]["statusReason"]
    world.checker.images[UNSIGNED] = existence.State.EXISTS
    world.clock[0] += cases.SETTINGS.poll
    await world.reconcile()
    assert world.writer.calls[-2][0] == "create"


async def test_a_kernel_edit_starts_every_verdict_over() -> None:
    world = World({cases.IMAGE: existence.State.EXISTS})
    world.modules.put(cases.module_raw())
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    before = world.status()["ns/m"]["lastTransitionTime"]
    current = world.validations.get("pfv")
    assert current is not None
    edited = copy.deepcopy(current)
    edited["metadata"]["generation"] = 2
    edited["spec"]["kernelVersion"] = cases.KERNEL + "+"  # the same kernel once trimmed
    world.validations.put(edited)
    await world.reconcile()
    after = world.validations.get("pfv")
    assert after is not None
    assert after["status"]["observedGeneration"] == 2
    assert world.status()["ns/m"]["lastTransitionTime"] != before
    assert world.status()["ns/m"]["verificationStatus"] == "Success"


async def test_a_validation_that_is_gone_or_going_is_left_alone() -> None:
    world = World()
    world.modules.put(cases.module_raw(build=True))
    await world.reconcile()
    going = cases.validation_raw()
    going["metadata"]["deletionTimestamp"] = "2026-12-02T11:00:00Z"
    world.validations.put(going)
    await world.reconcile()
    assert world.writer.calls == []
    assert world.checker.asked == {}


def test_preflight_pods_are_indexed_by_validation_and_not_as_the_modules() -> None:
    found = cases.validation()
    pod = cases.wanted_pod(found, cases.module_raw(build=True))
    pod["spec"]["containers"][0]["env"] = [{"name": "SECRET", "value": "not kept"}]
    pod["status"] = {"phase": "Failed", "initContainerStatuses": [{"name": "build"}]}
    kept = caches.project_pod(pod)
    assert kept["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    assert kept["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert kept["status"] == pod["status"]
    assert "spec" not in kept or "containers" not in kept["spec"]
    assert list(caches.preflight_index(kept)) == [labels.preflight_value("pfv")]
    assert caches.module_of_object(kept) is None
    assert list(caches.object_module_index(kept)) == []
    assert caches.validations_of_pod(kept) == ["pfv"]
    build_pod = {"metadata": {"name": "b", "labels": {labels.ROLE: "build", labels.MODULE_NAME: "m", labels.MODULE_NAMESPACE: "ns"}}}  # fmt: skip
    assert caches.module_of_object(build_pod) == "ns/m"
    assert caches.validations_of_pod(build_pod) == []
    assert list(caches.preflight_index(build_pod)) == []


def test_module_events_that_concern_validations() -> None:
    raw = cases.module_raw()
    status_only = copy.deepcopy(raw)
    status_only["status"] = {"conditions": []}
    status_only["metadata"]["resourceVersion"] = "11"
    spec = copy.deepcopy(raw)
    spec["metadata"]["generation"] = 2
    going = copy.deepcopy(raw)
    going["metadata"]["deletionTimestamp"] = "2026-12-02T11:00:00Z"
    assert caches.validations_of_module_change(None, raw)
    assert caches.validations_of_module_change(raw, None)
    assert not caches.validations_of_module_change(raw, status_only)
    assert caches.validations_of_module_change(raw, spec)
    assert caches.validations_of_module_change(raw, going)


_QUOTA = errors.Forbidden(
    403,
    'pods "pfv-builds-preflight" is forbidden: exceeded quota: pods, requested: pods=1, '
    "used: pods=1, limited: pods=1",
    reason="Forbidden",
    method="POST",
    path="/api/v1/namespaces/other/pods",
)


@pytest.mark.parametrize(
    "refusal",
    [
        _QUOTA,
        errors.Forbidden(
            403,
            'pods "x" is forbidden: unable to create new content in namespace other because it '
            "is being terminated",
            reason="Forbidden",
        ),
        errors.Forbidden(
            403,
            'pods "x" is forbidden: violates PodSecurity "restricted:latest": privileged',
            reason="Forbidden",
        ),
    ],
    ids=["quota", "terminating", "pod-security"],
)
async def test_a_refused_pod_is_its_modules_verdict_and_the_others_go_ahead(
    refusal: errors.ApiError,
) -> None:
    world = World()
    world.modules.put(cases.module_raw("builds", "other", build=True))
    world.modules.put(cases.module_raw("m", "ns", build=True))
    world.validations.put(cases.validation_raw())
    world.writer.refusing["other"] = refusal
    result = await world.reconcile()
    verdicts = world.status()
    refused = verdicts["other/builds"]
    assert refused["verificationStatus"] == "Failure"
    name = podnames.preflight_pod_name("pfv", "builds")
    assert refused["statusReason"] == (
        f"{preflight.REASON_BUILD_FAILED}: the API server refused pod other/{name}: "
        f"403 Forbidden: {refusal.message}"
    )
    assert refused["image"] == cases.IMAGE
    assert "pod" not in refused
    # The other Module's pod was made, and its verdict written with this one
    # (after the first round's verdicts, written while the registry was asked).
    assert verdicts["ns/m"]["verificationStatus"] == "InProgress"
    assert world.writer.calls == [
        ("status", "pfv"),
        ("create", podnames.preflight_pod_name("pfv", "m")),
        ("refused", name),
        ("status", "pfv"),
    ]
    # Asked again after the poll: a freed quota sends no event.
    assert result.requeue_after == cases.SETTINGS.poll
    world.writer.calls.clear()
    await world.reconcile()
    assert world.writer.calls == [("refused", name)]  # the same verdict: no write

    del world.writer.refusing["other"]
    await world.reconcile()
    assert world.status()["other/builds"]["verificationStatus"] == "InProgress"
    assert world.pods.get(f"other/{name}") is not None


async def test_a_transient_failure_of_a_create_ends_the_reconcile_unwritten() -> None:
    world = World()
    world.modules.put(cases.module_raw("m", "ns", build=True))
    world.validations.put(cases.validation_raw())
    world.writer.refusing["ns"] = errors.Unavailable(0, "connection refused")
    with pytest.raises(errors.Unavailable):
        await world.reconcile()
    # The first round's verdict (InProgress while the registry was asked)
    # is all that was written: the round whose create failed wrote nothing.
    name = podnames.preflight_pod_name("pfv", "m")
    assert world.writer.calls == [("status", "pfv"), ("refused", name)]


async def test_a_registry_that_never_answers_holds_no_validation() -> None:
    """The reconcile returns with the Module InProgress while its check
    hangs (counted: the checks asked and in flight); the verdict comes on
    the requeue once the registry answers."""
    world = World()
    answer: asyncio.Future[existence.Fact] = asyncio.get_running_loop().create_future()
    asked: list[str] = []

    async def hanging(key: existence.Key, secret: Obj | None) -> existence.Fact:
        asked.append(key.image)
        return await answer

    checker = existence.Checker(hanging)
    world.reconciler.checker = checker
    world.modules.put(cases.module_raw(build=True))
    world.validations.put(cases.validation_raw())
    try:
        await world.reconciler.reconcile("pfv")
        await asyncio.sleep(0)
        assert asked == [cases.IMAGE]
        assert checker.running() == 1
        verdict = world.status()["ns/m"]
        assert verdict["verificationStatus"] == "InProgress"
        assert world.writer.calls == [("status", "pfv")]  # no pod while unknown
        answer.set_result(existence.Fact(existence.State.EXISTS))
        await checker.settled()
        assert world.requeued == ["pfv"]
        await world.reconciler.reconcile("pfv")
        assert world.status()["ns/m"]["verificationStatus"] == "Success"
        assert asked == [cases.IMAGE]
    finally:
        await checker.close()


async def test_an_image_only_the_kernel_makes_invalid_fails_its_module_alone() -> None:
    """Admitted (its literal parts are a reference), a Module's image
    expands for the validation's kernel to a tag of 144 characters: that
    Module's verdict is a Failure naming why; the other Module is judged."""
    world = World({cases.IMAGE: existence.State.EXISTS})
    world.modules.put(cases.module_raw("fine"))
    long = cases.module_raw("long", build=True)
    mapping = long["spec"]["moduleLoader"]["container"]["kernelMappings"][0]
    mapping["containerImage"] = "r.io/m:" + "${KERNEL_FULL_VERSION}" * 9
    world.modules.put(long)
    world.validations.put(cases.validation_raw())
    await world.reconcile()
    verdicts = world.status()
    assert verdicts["ns/fine"]["verificationStatus"] == "Success"
    assert verdicts["ns/long"]["verificationStatus"] == "Failure"
    assert "image reference" in verdicts["ns/long"]["statusReason"]
    assert list(world.checker.asked) == [cases.IMAGE]
