"""The build concern's I/O policy: what it asks registries and the API
server, and when it asks again (a checker whose registry is a table)."""

from __future__ import annotations

import collections
import copy
from typing import Any

import test_build_planner as cases

from kmm.operator.build import concern, existence, images, planner, pods
from kmm.operator.build import settings as build_settings
from kmm.operator.loader import planner as loader_planner

Obj = dict[str, Any]


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
        self.gets: list[tuple[str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        self.gets.append((kind, name))
        data = {"dockerfile": "FROM scratch\n"} if kind == "ConfigMap" else {}
        return {"metadata": {"name": name, "resourceVersion": "1"}, "data": data}


def _view(raw: Obj, pods_: list[Obj] = ()) -> Any:  # type: ignore[assignment]
    return cases._view(raw, list(pods_))


async def _plan(build: concern.BuildConcern, raw: Obj, pods_: list[Obj] = ()) -> planner.BuildPlan:  # type: ignore[assignment]
    """A reconcile's plan, and again once the checks it started answered
    (what the checker's requeue makes the reconciler do), until none starts."""
    requeued: list[str] = []
    build.enqueue = requeued.append
    view = _view(raw, list(pods_))
    for _ in range(4):  # a plan that starts a check on every round never settles
        found = await build.plan(view, loader_planner.grouping(view).targets)
        build.done(view, found)
        if not build.checker.running():
            return found
        await build.checker.settled()
        assert set(requeued) == {"ns/m"}, requeued  # one per check that landed
        requeued.clear()
    raise AssertionError("the plan keeps asking the registry")


async def test_known_images_are_not_asked_again_and_inputs_read_only_when_missing() -> None:
    checker = _Checker({cases.IMAGE1: existence.State.EXISTS, cases.IMAGE2: existence.State.EXISTS})
    reader = _Reader()
    build = concern.BuildConcern(checker, reader)
    raw = cases._raw()
    for _ in range(3):
        found = await _plan(build, raw)
        assert found.gated == set()
    assert checker.asked == {cases.IMAGE1: 1, cases.IMAGE2: 1}
    # The repo Secret is read for each first check; no ConfigMap, no key.
    assert ("ConfigMap", "dockerfile") not in reader.gets
    assert len(reader.gets) == 2


async def test_a_module_without_build_asks_nothing() -> None:
    checker = _Checker({})
    build = concern.BuildConcern(checker, _Reader())
    found = await _plan(build, cases._raw(build=False, sign=False))
    assert found.images == []
    assert checker.asked == {}


async def test_a_moved_trigger_generation_asks_once_more() -> None:
    checker = _Checker({cases.IMAGE1: existence.State.EXISTS, cases.IMAGE2: existence.State.EXISTS})
    build = concern.BuildConcern(checker, _Reader())
    raw = cases._raw()
    await _plan(build, raw)
    bumped = copy.deepcopy(raw)
    bumped["spec"]["imageRebuildTriggerGeneration"] = 1
    for _ in range(2):
        found = await _plan(build, bumped)
    assert checker.asked == {cases.IMAGE1: 2, cases.IMAGE2: 2}
    assert build.trigger_generation(_view(bumped), found) == 1


async def test_a_succeeded_pod_has_its_image_asked_again_once() -> None:
    checker = _Checker({cases.IMAGE2: existence.State.EXISTS})
    build = concern.BuildConcern(checker, _Reader())
    raw = cases._raw(sign=False)
    (creation,) = (await _plan(build, raw)).create
    assert checker.asked[cases.IMAGE1] == 1
    checker.images[cases.IMAGE1] = existence.State.EXISTS  # the pod pushed it
    done = cases._ended(creation.pod, "Succeeded", "{}", uid="p1")
    found = await _plan(build, raw, [done])
    assert {i.kernel: i.state for i in found.images}[cases.K1] == "Exists"
    assert [e.reason for e in found.events] == ["BuildSucceeded"]
    assert found.delete == [done]
    again = await _plan(build, raw, [done])  # the cache still shows it a moment
    assert again.events == []
    assert checker.asked[cases.IMAGE1] == 2
    assert pods.pod_name("m", "build", cases.K1) == done["metadata"]["name"]


async def test_an_awaited_unsigned_image_is_asked_again_every_poll_until_it_exists() -> None:
    unsigned = f"r.io/unsigned:{cases.K1}"
    now = [100.0]
    checker = _Checker({cases.IMAGE2: existence.State.EXISTS}, clock=lambda: now[0])
    settings = build_settings.Settings(poll=10.0)
    build = concern.BuildConcern(checker, _Reader(), settings, monotonic=lambda: now[0])
    raw = cases._raw(build=False)
    found = await _plan(build, raw)
    assert found.create == []
    assert {i.kernel: i.state for i in found.images}[cases.K1] == "Missing"
    assert found.requeue_after == 10.0
    for _ in range(2):  # within the poll: remembered
        await _plan(build, raw)
    assert checker.asked[unsigned] == 1
    for asked in (2, 3):
        now[0] += 10.0
        found = await _plan(build, raw)
        assert found.create == []
        assert checker.asked[unsigned] == asked
    assert checker.asked[cases.IMAGE1] == 1  # the final image stays known missing
    checker.images[unsigned] = existence.State.EXISTS
    now[0] += 10.0
    (creation,) = (await _plan(build, raw)).create
    assert creation.pod["metadata"]["labels"]["kmm.node.kubernetes.io/role"] == "sign"
    await _plan(build, raw)
    assert checker.asked[unsigned] == 4


def _role(pod: Obj) -> str:
    return str(pod["metadata"]["labels"]["kmm.node.kubernetes.io/role"])


async def test_a_moved_trigger_builds_again_rather_than_sign_the_stale_intermediate_image() -> None:
    # The final image was deleted; the intermediate one an earlier build left is still there.
    stale = images.intermediate_image(cases.IMAGE1)
    registry = {cases.IMAGE2: existence.State.EXISTS, stale: existence.State.EXISTS}
    raw = cases._raw()
    # No trigger pass: the intermediate image is signed (an interrupted sign is never a rebuild).
    (creation,) = (
        await _plan(concern.BuildConcern(_Checker(dict(registry)), _Reader()), raw)
    ).create
    assert _role(creation.pod) == "sign"

    bumped = copy.deepcopy(raw)
    bumped["spec"]["imageRebuildTriggerGeneration"] = 2
    bumped["status"] = {"imageRebuildTriggerGeneration": 1}
    checker = _Checker(dict(registry))
    build = concern.BuildConcern(checker, _Reader())
    (creation,) = (await _plan(build, bumped)).create
    assert _role(creation.pod) == "build"
    assert checker.asked[stale] == 0  # not asked: it is not signed either way
    running = cases._running(creation.pod)
    for _ in range(2):
        found = await _plan(build, bumped, [running])
        assert found.create == []
        assert {i.kernel: i.state for i in found.images}[cases.K1] == "Building"
    built = cases._ended(creation.pod, "Succeeded", "{}", uid="b1")
    (signing,) = (await _plan(build, bumped, [built])).create
    assert _role(signing.pod) == "sign"
    assert checker.asked[stale] == 1  # what the pass's build pushed
    # The new image's sign fails: retried as a sign once fixed, never rebuilt.
    failed = cases._ended(signing.pod, "Failed", "kmm-sign: error: bad key", uid="s1", exit_code=1)
    for _ in range(2):
        found = await _plan(build, bumped, [failed])
        assert found.create == []
        assert {i.kernel: i.state for i in found.images}[cases.K1] == "SignFailed"


async def test_a_moved_trigger_deletes_a_failed_sign_of_the_stale_image_and_builds() -> None:
    stale = images.intermediate_image(cases.IMAGE1)
    checker = _Checker({cases.IMAGE2: existence.State.EXISTS, stale: existence.State.EXISTS})
    build = concern.BuildConcern(checker, _Reader())
    raw = cases._raw()
    (signing,) = (await _plan(build, raw)).create
    failed = cases._ended(signing.pod, "Failed", "kmm-sign: error: x", uid="s0", exit_code=1)
    assert (await _plan(build, raw, [failed])).create == []
    bumped = copy.deepcopy(raw)
    bumped["spec"]["imageRebuildTriggerGeneration"] = 1
    found = await _plan(build, bumped, [failed])
    assert found.delete == [failed]
    assert [_role(c.pod) for c in found.create] == ["build"]
    # Once the status says the pass is done, nothing is remembered of it.
    done = copy.deepcopy(bumped)
    done["status"] = {"imageRebuildTriggerGeneration": 1}
    await _plan(build, done, [failed])
    assert build._passes == {}
