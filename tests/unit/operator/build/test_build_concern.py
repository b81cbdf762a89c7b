"""The build concern's I/O policy: what it asks registries and the API
server, and when it asks again (a checker whose registry is a table of
facts, labels included), and what an image's labels make it do: build
again, sign, pin, delete the intermediate image; and the pull pods it asks
nodes with where the registry check cannot decide."""

from __future__ import annotations

import asyncio
import collections
import copy
import json
from typing import Any

import operator_fixtures as fixtures
import test_build_planner as cases

from kmm.api import labels
from kmm.operator.build import (
    concern,
    desired,
    existence,
    images,
    inputs,
    planner,
    podnames,
    podstatus,
)
from kmm.operator.build import settings as build_settings
from kmm.operator.loader import planner as loader_planner

Obj = dict[str, Any]
Entry = existence.State | existence.Fact
DIGEST = "sha256:" + "d" * 64


class _Checker(existence.Checker):
    """A checker whose registry is a table (``images``: a state, or a whole
    fact; an image that exists has its labels read, {} when none), and
    whose deletes are recorded and answered with ``deleting``."""

    def __init__(self, images: dict[str, Entry], **more: Any) -> None:
        super().__init__(self._table, delete=self._delete, **more)
        self.images = images
        self.asked: collections.Counter[str] = collections.Counter()
        self.deleted: list[tuple[str, str]] = []
        self.deleting = existence.Deletion("deleted")

    async def _table(self, key: existence.Key, secret: Obj | None) -> existence.Fact:
        self.asked[key.image] += 1
        found = self.images.get(key.image, existence.State.MISSING)
        if isinstance(found, existence.Fact):
            return found
        if found is existence.State.EXISTS:
            return existence.Fact(found, digest=DIGEST, labels={})
        return existence.Fact(found)

    async def _delete(
        self, key: existence.Key, secret: Obj | None, digest: str
    ) -> existence.Deletion:
        self.deleted.append((key.image, digest))
        return self.deleting


class _Reader:
    def __init__(self) -> None:
        self.gets: list[tuple[str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        self.gets.append((kind, name))
        data = {"dockerfile": "FROM scratch\n"} if kind == "ConfigMap" else {}
        return {"metadata": {"name": name, "resourceVersion": "1"}, "data": data}


def _view(raw: Obj, pods_: list[Obj] = ()) -> Any:  # type: ignore[assignment]
    return cases._view(raw, list(pods_))


async def _plan(
    build: concern.BuildConcern, raw: Obj, pods_: list[Obj] = (), nodes: list[Obj] | None = None
) -> planner.BuildPlan:  # type: ignore[assignment]
    """A reconcile's plan, and again once the checks it started answered
    (what the checker's requeue makes the reconciler do), until none starts;
    its events are those every round told."""
    requeued: list[str] = []
    told: list[planner.Event] = []
    build.enqueue = requeued.append
    view = (
        _view(raw, list(pods_))
        if nodes is None
        else fixtures.view(fixtures.module(raw), nodes, pods=list(pods_))
    )
    for _ in range(4):  # a plan that starts a check on every round never settles
        found = await build.plan(view, loader_planner.grouping(view).targets)
        build.done(view, found)
        told += found.events
        if not build.checker.running():
            found.events = told
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
    assert podnames.pod_name("m", "build", cases.K1) == done["metadata"]["name"]


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


async def _as_asked(raw: Obj, *, signed: bool, trigger: str = "") -> dict[str, str]:
    """The labels an image of K1 made now from ``raw`` carries (the inputs
    ``_Reader`` gives), signed or not; ``trigger``: the pass that built it."""
    view = _view(raw)
    target = loader_planner.grouping(view).targets[cases.K1]
    found = await inputs.read(_Reader(), "ns", inputs.wanted(view.module, target))
    wanted = desired.wanted(view.module, target, found, build_settings.Settings())
    assert wanted is not None
    made = {labels.IMAGE_BUILD_HASH: str(wanted.build), labels.IMAGE_REBUILD_TRIGGER: trigger}
    if signed:
        made.update({labels.IMAGE_SIGNED: "true", labels.IMAGE_SIGN_HASH: str(wanted.sign)})
    return made


def _image(found: dict[str, str], digest: str = DIGEST) -> existence.Fact:
    return existence.Fact(existence.State.EXISTS, digest=digest, labels=found)


def _states(found: planner.BuildPlan) -> dict[str, str]:
    return {i.kernel: i.state for i in found.images}


async def test_an_intermediate_image_is_signed_only_when_this_build_made_it() -> None:
    raw = cases._raw()
    intermediate = images.intermediate_image(cases.IMAGE1)
    made = await _as_asked(raw, signed=False)
    made_pods: list[Obj] = []
    for left, role in (
        (_image(made), "sign"),
        # An earlier build's, from another Dockerfile: built again, never signed.
        (_image({**made, labels.IMAGE_BUILD_HASH: "older"}), "build"),
        # Pushed by an older kmm, or by hand: nothing says what made it.
        (_image({}), "build"),
    ):
        registry: dict[str, Entry] = {cases.IMAGE2: existence.State.EXISTS, intermediate: left}
        build = concern.BuildConcern(_Checker(registry), _Reader())
        (creation,) = (await _plan(build, raw)).create
        assert _role(creation.pod) == role, left.labels
        made_pods.append(creation.pod)
    # The sign pod checks its input again (a push may land in between).
    assert cases._env(made_pods[0], "KMM_EXPECT_BUILD_HASH") == made[labels.IMAGE_BUILD_HASH]


async def test_a_trigger_pass_survives_a_new_operator_instance() -> None:
    """The intermediate image of the pass before is built again, never
    signed; the pass's own is signed, not built twice: the labels say which
    is which, after a restart too (nothing of the pass is in memory)."""
    raw = cases._raw()
    bumped = copy.deepcopy(raw)
    bumped["spec"]["imageRebuildTriggerGeneration"] = 2
    bumped["status"] = {"imageRebuildTriggerGeneration": 1}
    intermediate = images.intermediate_image(cases.IMAGE1)
    registry: dict[str, Entry] = {
        cases.IMAGE2: existence.State.EXISTS,
        intermediate: _image(await _as_asked(raw, signed=False)),  # the earlier pass's
    }
    first = concern.BuildConcern(_Checker(registry), _Reader())
    (creation,) = (await _plan(first, bumped)).create
    assert _role(creation.pod) == "build"
    # A new instance, the pass's build still running: it is waited for.
    running = cases._running(creation.pod)
    second = concern.BuildConcern(_Checker(registry), _Reader())
    found = await _plan(second, bumped, [running])
    assert (found.create, _states(found)[cases.K1]) == ([], "Building")
    # The build pushed (and its pod is gone): a third instance signs it.
    registry[intermediate] = _image(await _as_asked(bumped, signed=False, trigger="2"))
    third = concern.BuildConcern(_Checker(registry), _Reader())
    (signing,) = (await _plan(third, bumped)).create
    assert _role(signing.pod) == "sign"


async def test_sign_added_after_a_build_only_image_rebuilds_and_signs() -> None:
    unsigned_raw = cases._raw(sign=False)
    registry: dict[str, Entry] = {
        cases.IMAGE1: _image(await _as_asked(unsigned_raw, signed=False)),
        cases.IMAGE2: existence.State.EXISTS,
    }
    checker = _Checker(registry)
    build = concern.BuildConcern(checker, _Reader())
    found = await _plan(build, unsigned_raw)
    assert (found.create, found.gated) == ([], set())
    assert found.digests == {cases.K1: DIGEST}  # kmm built it: the loader pins it
    signing = cases._raw()
    signing["metadata"]["generation"] = 2
    found = await _plan(build, signing)
    (creation,) = found.create
    assert _role(creation.pod) == "build"
    assert cases._env(creation.pod, "KMM_IMAGE") == images.intermediate_image(cases.IMAGE1)
    assert found.gated == {cases.K1}  # no new loader runs the unsigned image meanwhile
    assert found.digests == {}
    (told,) = [e for e in found.events if e.reason == "ImageOutdated"]
    assert "it is not signed" in told.message
    again = await _plan(build, signing, [cases._running(creation.pod)])
    assert [e.reason for e in again.events] == []  # told once


async def test_a_converged_module_reads_its_inputs_once_per_generation() -> None:
    raw = cases._raw(sign=False)
    registry: dict[str, Entry] = {
        cases.IMAGE1: _image(await _as_asked(raw, signed=False)),
        cases.IMAGE2: existence.State.EXISTS,
    }
    reader = _Reader()
    build = concern.BuildConcern(_Checker(registry), reader)
    await _plan(build, raw)
    compared = len(reader.gets)
    assert ("ConfigMap", "dockerfile") in reader.gets  # K1's labels compared once
    for _ in range(3):
        found = await _plan(build, raw)
        assert found.digests == {cases.K1: DIGEST}
    assert len(reader.gets) == compared
    moved = copy.deepcopy(raw)
    moved["metadata"]["generation"] = 2
    for _ in range(3):
        await _plan(build, moved)
    assert reader.gets[compared:].count(("ConfigMap", "dockerfile")) == 1


async def test_an_image_kmm_did_not_build_is_taken_as_it_is() -> None:
    raw = cases._raw()
    checker = _Checker({cases.IMAGE1: existence.State.EXISTS, cases.IMAGE2: existence.State.EXISTS})
    reader = _Reader()
    build = concern.BuildConcern(checker, reader)
    found = await _plan(build, raw)
    assert (found.create, found.gated, found.digests) == ([], set(), {})
    assert set(_states(found).values()) == {"Exists"}
    assert [kind for kind, _ in reader.gets] == ["Secret", "Secret"]  # the checks' only
    assert checker.asked[images.intermediate_image(cases.IMAGE1)] == 0


async def _signed_pod(build: concern.BuildConcern, raw: Obj, uid: str) -> Obj:
    (creation,) = (await _plan(build, raw)).create
    assert _role(creation.pod) == "sign"
    summary = {"signed": ["/a.ko"], "unmatched": [], "unsignedDigest": DIGEST}
    return cases._ended(creation.pod, "Succeeded", json.dumps(summary), uid=uid)


async def test_the_intermediate_image_is_deleted_once_signed() -> None:
    raw = cases._raw()
    intermediate = images.intermediate_image(cases.IMAGE1)
    registry: dict[str, Entry] = {
        cases.IMAGE2: existence.State.EXISTS,
        intermediate: _image(await _as_asked(raw, signed=False)),
    }
    checker = _Checker(registry)
    build = concern.BuildConcern(checker, _Reader())
    done = await _signed_pod(build, raw, "s1")
    registry[cases.IMAGE1] = _image(await _as_asked(raw, signed=True), "sha256:" + "f" * 64)
    for _ in range(3):
        found = await _plan(build, raw, [done])
        await checker.settled()
    assert checker.deleted == [(intermediate, DIGEST)]  # by the digest signed, once
    assert [e.reason for e in found.events] == []
    # Deleted: known missing at once, not asked again.
    assert checker.known(images.keys(_view(raw).module, loader_planner.grouping(_view(raw)).targets[cases.K1])[1]) is not None  # fmt: skip


async def test_a_registry_that_refuses_deletes_is_told_once_and_breaks_nothing() -> None:
    raw = cases._raw()
    intermediate = images.intermediate_image(cases.IMAGE1)
    registry: dict[str, Entry] = {
        cases.IMAGE2: existence.State.EXISTS,
        intermediate: _image(await _as_asked(raw, signed=False)),
    }
    checker = _Checker(registry)
    checker.deleting = existence.Deletion("refused", "DELETE ...: answered 405 UNSUPPORTED")
    build = concern.BuildConcern(checker, _Reader())
    done = await _signed_pod(build, raw, "s1")
    events: list[str] = []
    for _ in range(3):
        found = await _plan(build, raw, [done])
        events += [
            e.reason for e in found.events if e.type == "Normal" and "Intermediate" in e.reason
        ]
        await checker.settled()
        await asyncio.sleep(0)
    assert events == ["IntermediateImageKept"]
    assert found.problems == []
    # A later sign of the same image: not tried again, not told again.
    registry[cases.IMAGE1] = existence.State.MISSING
    build.checker.forget(cases.IMAGE1)
    later = await _signed_pod(build, raw, "s2")
    for _ in range(2):
        found = await _plan(build, raw, [later])
        await checker.settled()
        assert all(e.reason != "IntermediateImageKept" for e in found.events)
    assert len(checker.deleted) == 1


def _nodes(*, real_k1: bool = True) -> list[Obj]:
    fake = fixtures.node("kwok-1", cases.K1)
    fake["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake"}
    found = [fake, fixtures.node("real-k2", cases.K2)]
    if real_k1:
        found.append(fixtures.node("real-k1", cases.K1))
    return found


def _pull_pod(found: planner.BuildPlan) -> Obj:
    (creation,) = [c for c in found.create if _role(c.pod) == "pull"]
    return creation.pod


def _affinity(pod: Obj) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    return list(terms["nodeSelectorTerms"][0]["matchFields"][0]["values"])


async def test_an_undecided_image_is_asked_of_a_node_that_runs_containers() -> None:
    raw = cases._raw(sign=False)
    # Reachable from the nodes only (a mirror, a network the operator is not in).
    undecided = existence.Fact(
        existence.State.ERROR, "no answer", undecided=True, failure="Unreachable"
    )
    registry: dict[str, Entry] = {cases.IMAGE1: undecided, cases.IMAGE2: existence.State.EXISTS}
    build = concern.BuildConcern(_Checker(registry), _Reader())
    found = await _plan(build, raw, nodes=_nodes())
    pod = _pull_pod(found)
    assert _affinity(pod) == ["real-k1"]  # the kernel's, and never KWOK's
    assert found.gated == {cases.K1}
    assert _states(found)[cases.K1] == "Checking"
    (container,) = pod["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (cases.IMAGE1, "Always")
    assert pod["spec"]["imagePullSecrets"] == [{"name": "repo"}]
    assert container["securityContext"]["runAsNonRoot"] is True
    # No node of the kernel runs containers: another selected one is asked.
    other = concern.BuildConcern(_Checker(dict(registry)), _Reader())
    assert _affinity(_pull_pod(await _plan(other, raw, nodes=_nodes(real_k1=False)))) == ["real-k2"]

    # The node says the image is not there: it is built, the pod goes.
    pulled = copy.deepcopy(pod)
    pulled["metadata"]["uid"] = "pull-1"
    pulled["spec"]["nodeName"] = "real-k1"
    pulled["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "pull",
                "state": {
                    "waiting": {
                        "reason": "ErrImagePull",
                        "message": f'rpc error: code = NotFound desc = failed to pull and unpack image "{cases.IMAGE1}": not found',
                    }
                },
            }
        ],
    }
    found = await _plan(build, raw, [pulled], nodes=_nodes())
    assert [_role(c.pod) for c in found.create] == ["build"]
    assert found.delete == [pulled]
    # Once the build succeeded the image is asked again: a node again, which finds it.
    registry[cases.IMAGE1] = undecided
    build.checker.forget(cases.IMAGE1)
    found = await _plan(build, raw, [pulled], nodes=_nodes())
    assert found.delete == [pulled]  # judged already: not its verdict again
    done = copy.deepcopy(pulled)
    done["metadata"]["uid"] = "pull-2"
    done["status"] = {"phase": "Succeeded"}
    found = await _plan(build, raw, [done], nodes=_nodes())
    assert _states(found)[cases.K1] == "Exists"
    assert found.digests == {}  # a node's verdict has no digest: not pinned
    assert found.delete == [done]


async def test_a_build_counts_as_done_once_its_container_exited_0_not_once_its_phase_says() -> None:
    """The kubelet reports ``Succeeded`` only after it tore the pod down (a
    second or more): the image is asked again, and the kernel's loader may
    go, as soon as the container exited 0."""
    raw = cases._raw(sign=False)
    checker = _Checker({cases.IMAGE2: existence.State.EXISTS})
    build = concern.BuildConcern(checker, _Reader())
    (creation,) = (await _plan(build, raw)).create
    exited = cases._ended(creation.pod, "Running", '{"pushed": true}', uid="b1")
    checker.images[cases.IMAGE1] = existence.State.EXISTS  # it pushed
    found = await _plan(build, raw, [exited])
    assert [e.reason for e in found.events] == ["BuildSucceeded"]
    assert checker.asked[cases.IMAGE1] == 2  # asked again at once
    assert found.gated == set()  # the loader may go
    failed = cases._ended(creation.pod, "Running", "kmm-build: error: x", uid="b2", exit_code=1)
    assert not podstatus.succeeded(failed)
