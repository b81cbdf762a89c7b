"""The build planner, table by table: from facts, inputs and observed pods
to pods created and deleted, kernels gated, status entries and Events."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.operator import views
from kmm.operator.build import existence, hashing, images, planner, podnames
from kmm.operator.build import inputs as build_inputs
from kmm.operator.build import settings as build_settings
from kmm.operator.loader import planner as loader_planner

Obj = dict[str, Any]
K1, K2 = "6.8.0-45-generic", "6.1.0-27-amd64"
IMAGE1, IMAGE2 = "r.io/m:k1", "r.io/m:k2"
NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
EXISTS = existence.Fact(existence.State.EXISTS)
MISSING = existence.Fact(existence.State.MISSING, "missing")
INPUTS = build_inputs.Snapshot(
    versions={
        "ConfigMap/dockerfile": "5",
        "Secret/key": "6",
        "Secret/cert": "7",
        "Secret/repo": "8",
    },
    dockerfiles={"dockerfile": "FROM scratch\n"},
)
SETTINGS = build_settings.Settings(builder_image="b.io/builder:1", poll=10.0)


def _raw(*, build: bool = True, sign: bool = True) -> Obj:
    container: Obj = {
        "modprobe": {"moduleName": "kmod_x"},
        "kernelMappings": [
            {"literal": K1, "containerImage": IMAGE1},
            {"literal": K2, "containerImage": IMAGE2},
        ],
    }
    if build:
        container["build"] = {"dockerfileConfigMap": {"name": "dockerfile"}}
    if sign:
        container["sign"] = {
            "keySecret": {"name": "key"},
            "certSecret": {"name": "cert"},
            "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/*.ko"],
            **({} if build else {"unsignedImage": "r.io/unsigned:${KERNEL_FULL_VERSION}"}),
        }
    return fixtures.module_raw(
        moduleLoader={"container": container}, imageRepoSecret={"name": "repo"}
    )


def _view(raw: Obj, pods_: list[Obj] = ()) -> views.ModuleView:  # type: ignore[assignment]
    module = fixtures.module(raw)
    nodes = [fixtures.node("n1", K1), fixtures.node("n2", K2)]
    return fixtures.view(module, nodes, pods=list(pods_))


def _plan(
    view: views.ModuleView,
    facts: dict[str, images.Facts],
    *,
    inputs: build_inputs.Snapshot = INPUTS,
    noticed: set[str] | None = None,
    settings: build_settings.Settings = SETTINGS,
) -> planner.BuildPlan:
    targets = loader_planner.grouping(view).targets
    return planner.plan(
        view, targets, facts, inputs, noticed=noticed or set(), settings=settings, now=NOW
    )


def _env(pod: Obj, name: str) -> str:
    for container in pod["spec"]["containers"]:
        for item in container.get("env") or ():
            if item["name"] == name:
                return str(item["value"])
    raise KeyError(name)


def _ended(pod: Obj, phase: str, message: str, *, uid: str = "u1", exit_code: int = 0) -> Obj:
    found = copy.deepcopy(pod)
    found["metadata"]["uid"] = uid
    found["status"] = {
        "phase": phase,
        "containerStatuses": [
            {
                "name": "main",
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "message": message,
                        "finishedAt": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                },
            }
        ],
    }
    return found


def _running(pod: Obj) -> Obj:
    found = copy.deepcopy(pod)
    found["metadata"]["uid"] = "u0"
    found["status"] = {"phase": "Running"}
    return found


BOTH_EXIST = {K1: images.Facts(EXISTS), K2: images.Facts(EXISTS)}


def test_a_module_without_build_or_sign_gets_an_empty_plan() -> None:
    view = _view(_raw(build=False, sign=False))
    targets = loader_planner.grouping(view).targets
    assert planner.concerned(targets) == {}
    found = planner.plan(view, targets, {}, INPUTS, noticed=set(), settings=SETTINGS, now=NOW)
    assert (found.create, found.gated, found.images, found.problems) == ([], set(), [], [])


def test_existing_images_need_nothing() -> None:
    found = _plan(_view(_raw()), BOTH_EXIST)
    assert found.create == []
    assert found.gated == set()
    assert [(i.kernel, i.state) for i in found.images] == [(K2, "Exists"), (K1, "Exists")]
    assert found.all_exist()
    assert found.requeue_after is None


def test_a_missing_image_without_sign_gets_one_build_pod_pushing_the_final_image() -> None:
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    found = _plan(_view(_raw(sign=False)), facts)
    (creation,) = found.create
    assert creation.pod["metadata"]["name"] == podnames.pod_name("m", "build", K1)
    assert _env(creation.pod, "KMM_IMAGE") == IMAGE1
    assert hashing.of_pod(creation.pod)
    assert creation.event.reason == "BuildCreated"
    assert found.gated == {K1}  # K2's loader goes ahead
    states = {i.kernel: i.state for i in found.images}
    assert states == {K1: "Building", K2: "Exists"}


def test_with_sign_the_build_pushes_the_intermediate_image_only() -> None:
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(_raw()), facts).create
    assert creation.pod["metadata"]["labels"]["kmm.node.kubernetes.io/role"] == "build"
    assert _env(creation.pod, "KMM_IMAGE") == images.intermediate_image(IMAGE1)


def test_once_the_intermediate_image_exists_a_sign_pod_pushes_the_final_one() -> None:
    facts = {K1: images.Facts(MISSING, EXISTS), K2: images.Facts(EXISTS)}
    found = _plan(_view(_raw()), facts)
    (creation,) = found.create
    assert creation.event.reason == "SignCreated"
    assert _env(creation.pod, "KMM_IMAGE") == IMAGE1
    assert _env(creation.pod, "KMM_UNSIGNED_IMAGE") == images.intermediate_image(IMAGE1)
    assert found.gated == {K1}
    assert {i.kernel: i.state for i in found.images}[K1] == "Signing"


def test_sign_without_build_signs_the_unsigned_image() -> None:
    facts = {K1: images.Facts(MISSING, EXISTS), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(_raw(build=False)), facts).create
    assert _env(creation.pod, "KMM_UNSIGNED_IMAGE") == f"r.io/unsigned:{K1}"
    assert _env(creation.pod, "KMM_IMAGE") == IMAGE1


def test_sign_without_build_waits_for_its_unsigned_image_without_a_pod() -> None:
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    view = _view(_raw(build=False))
    found = _plan(view, facts)
    assert found.create == []
    assert found.gated == {K1}
    (waiting,) = [i for i in found.images if i.kernel == K1]
    assert waiting.state == "Missing"
    assert waiting.message is not None
    assert f"r.io/unsigned:{K1}" in waiting.message
    assert found.requeue_after == SETTINGS.poll
    targets = loader_planner.grouping(view).targets
    assert images.foreign_unsigned(targets[K1]) == f"r.io/unsigned:{K1}"
    assert images.keys(view.module, targets[K1])[1].image == f"r.io/unsigned:{K1}"


def _failed_build(raw: Obj, inputs: build_inputs.Snapshot = INPUTS) -> Obj:
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts, inputs=inputs).create
    tail = "\n".join(f"line {i}" for i in range(20)) + "\nkmm-build: RUN make failed"
    return _ended(creation.pod, "Failed", tail, exit_code=1)


def test_a_failed_pod_is_kept_shown_and_told_once() -> None:
    raw = _raw(sign=False)
    failed = _failed_build(raw)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    found = _plan(_view(raw, [failed]), facts)
    assert (found.create, found.delete) == ([], [])
    (problem,) = found.problems
    assert problem.reason == "BuildFailed"
    assert failed["metadata"]["name"] in problem.message
    assert "kmm-build: RUN make failed" in problem.message
    assert "line 10" not in problem.message  # only the tail
    assert [e.reason for e in found.events] == ["BuildFailed"]
    assert found.requeue_after == SETTINGS.poll
    assert {i.kernel: i.state for i in found.images}[K1] == "BuildFailed"
    again = _plan(_view(raw, [failed]), facts, noticed=found.noticed)
    assert again.events == []
    assert (again.create, again.delete) == ([], [])


@pytest.mark.parametrize(
    "changed",
    [
        build_inputs.Snapshot(versions={**INPUTS.versions, "ConfigMap/dockerfile": "50"}, dockerfiles=INPUTS.dockerfiles),
        build_inputs.Snapshot(versions=INPUTS.versions, dockerfiles={"dockerfile": "FROM other\n"}),
        build_inputs.Snapshot(versions={**INPUTS.versions, "Secret/repo": "80"}, dockerfiles=INPUTS.dockerfiles),
    ],
    ids=["configmap-version", "dockerfile-text", "repo-secret-version"],
)  # fmt: skip
def test_a_failed_pod_whose_inputs_changed_is_deleted_to_be_made_again(
    changed: build_inputs.Snapshot,
) -> None:
    raw = _raw(sign=False)
    failed = _failed_build(raw)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    found = _plan(_view(raw, [failed]), facts, inputs=changed)
    assert found.delete == [failed]
    assert found.create == []  # next reconcile, once it is gone
    assert found.problems == []


def test_a_moved_trigger_retries_a_failed_pod_whose_inputs_did_not_change() -> None:
    raw = _raw(sign=False)
    failed = _failed_build(raw)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    assert _plan(_view(raw, [failed]), facts).delete == []
    bumped = copy.deepcopy(raw)
    bumped["spec"]["imageRebuildTriggerGeneration"] = 1
    found = _plan(_view(bumped, [failed]), facts)
    assert found.delete == [failed]
    assert found.problems == []
    # The pod made for the pass is kept once it failed: the trigger asked once.
    (creation,) = _plan(_view(bumped), facts).create
    again = _ended(creation.pod, "Failed", "kmm-build: RUN make failed", exit_code=1)
    assert _plan(_view(bumped, [again]), facts).delete == []


def test_a_failed_sign_is_retried_as_a_sign_never_by_a_rebuild() -> None:
    raw = _raw()
    facts = {K1: images.Facts(MISSING, EXISTS), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    failed = _ended(creation.pod, "Failed", "kmm-sign: the key does not match", exit_code=1)
    # The final image is missing; the intermediate one is not even asked for.
    found = _plan(_view(raw, [failed]), {**facts, K1: images.Facts(MISSING)})
    assert found.create == []
    assert [p.reason for p in found.problems] == ["SignFailed"]
    assert {i.kernel: i.state for i in found.images}[K1] == "SignFailed"
    changed = build_inputs.Snapshot(versions={**INPUTS.versions, "Secret/key": "60"}, dockerfiles=INPUTS.dockerfiles)  # fmt: skip
    retried = _plan(_view(raw, [failed]), {**facts, K1: images.Facts(MISSING)}, inputs=changed)
    assert retried.delete == [failed]
    assert retried.create == []


def test_a_succeeded_sign_pod_is_told_and_deleted_after_the_retention() -> None:
    raw = _raw()
    facts = {K1: images.Facts(MISSING, EXISTS), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    summary = {"signed": ["/opt/lib/modules/k/a.ko"], "unmatched": ["/opt/lib/modules/k/*.x"]}
    done = _ended(creation.pod, "Succeeded", json.dumps(summary))
    found = _plan(_view(raw, [done]), BOTH_EXIST)
    assert found.delete == [done]
    assert sorted((e.type, e.reason) for e in found.events) == [
        ("Normal", "SignSucceeded"),
        ("Warning", "FilesToSignUnmatched"),
    ]
    warning = next(e for e in found.events if e.type == "Warning")
    assert "/opt/lib/modules/k/*.x" in warning.message
    assert K1 in warning.message
    kept = _plan(
        _view(raw, [done]), BOTH_EXIST, settings=build_settings.Settings(retention=60.0), noticed=found.noticed
    )  # fmt: skip
    assert kept.delete == []
    assert kept.events == []
    assert kept.requeue_after == pytest.approx(60.0)


def test_a_running_pod_is_waited_for() -> None:
    raw = _raw(sign=False)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    found = _plan(_view(raw, [_running(creation.pod)]), facts)
    assert (found.create, found.delete, found.problems) == ([], [], [])
    assert {i.kernel: i.state for i in found.images}[K1] == "Building"
    assert found.gated == {K1}


def test_rejected_credentials_are_an_authentication_error_and_never_a_build() -> None:
    refused = existence.Fact(existence.State.AUTH_FAILED, "imageRepoSecret ns/repo: refused")
    found = _plan(_view(_raw()), {K1: images.Facts(refused), K2: images.Facts(EXISTS)})
    assert found.create == []
    assert found.gated == {K1}
    assert [(p.reason, p.message) for p in found.problems] == [
        ("AuthenticationFailed", "imageRepoSecret ns/repo: refused")
    ]
    assert [e.reason for e in found.events] == ["AuthenticationFailed"]
    again = _plan(
        _view(_raw()), {K1: images.Facts(refused), K2: images.Facts(EXISTS)}, noticed=found.noticed
    )  # fmt: skip
    assert again.events == []


def test_a_missing_configmap_is_shown_and_nothing_built() -> None:
    inputs = build_inputs.Snapshot(versions={"Secret/repo": "8"})
    found = _plan(_view(_raw(sign=False)), {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}, inputs=inputs)  # fmt: skip
    assert found.create == []
    (problem,) = found.problems
    assert "ConfigMap ns/dockerfile does not exist" in problem.message
    assert found.requeue_after == SETTINGS.poll
    (event,) = found.events
    assert (event.type, event.reason) == ("Warning", "BuildFailed")
    assert "ConfigMap ns/dockerfile does not exist" in event.message
    # Told once: the next reconcile, inputs still missing, says nothing new.
    again = _plan(_view(_raw(sign=False)), {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}, inputs=inputs, noticed=found.noticed)  # fmt: skip
    assert again.events == []


def test_a_succeeded_pod_names_the_image_to_check_again_once() -> None:
    raw = _raw()
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    done = _ended(creation.pod, "Succeeded", "{}", uid="b1")
    view = _view(raw, [done])
    targets = loader_planner.grouping(view).targets
    assert planner.pushed_by_succeeded(view, targets, set()) == {images.intermediate_image(IMAGE1)}
    assert planner.pushed_by_succeeded(view, targets, {"b1"}) == set()


def test_the_loader_creates_no_daemonset_for_a_gated_kernel_and_keeps_an_existing_one() -> None:
    view = _view(_raw())
    free = loader_planner.plan(view)
    assert len(free.apply) == 2
    gated = loader_planner.plan(view, gated={K1})
    (applied,) = gated.apply
    assert applied["metadata"]["labels"]["kmm.node.kubernetes.io/kernel-version.full"] == K2
    assert gated.targeted == {"n1", "n2"}  # still targeted: the Module is not Ready yet
    existing = next(
        ds
        for ds in free.apply
        if ds["metadata"]["labels"]["kmm.node.kubernetes.io/kernel-version.full"] == K1
    )
    module = fixtures.module(_raw())
    nodes = [fixtures.node("n1", K1), fixtures.node("n2", K2)]
    kept = loader_planner.plan(fixtures.view(module, nodes, daemonsets=[existing]), gated={K1})
    assert kept.delete == []
    assert existing in kept.current


def test_a_registry_that_does_not_answer_gates_the_kernel_and_builds_nothing() -> None:
    failing = existence.Fact(existence.State.ERROR, "no answer from r.io", retry_at=5.0)
    found = _plan(_view(_raw()), {K1: images.Facts(failing), K2: images.Facts(EXISTS)})
    assert found.create == []
    assert found.gated == {K1}
    assert found.problems == []
    image = {i.kernel: i for i in found.images}[K1]
    assert (image.state, image.message) == ("Checking", "no answer from r.io")


def test_build_and_sign_pods_go_where_the_mappings_build_selector_says() -> None:
    raw = _raw()
    container = raw["spec"]["moduleLoader"]["container"]
    # The mapping's selector wins over the container level's (KMM drops it).
    container["build"]["selector"] = {"pool": "container-level"}
    container["kernelMappings"][0]["build"] = {"selector": {"pool": "builders"}}
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(MISSING, EXISTS)}
    found = _plan(_view(raw), facts)
    by_name = {c.pod["metadata"]["name"]: c.pod for c in found.create}
    assert by_name[podnames.pod_name("m", "build", K1)]["spec"]["nodeSelector"] == {
        "pool": "builders"
    }
    # The sign pod of a Module that builds goes where its build does.
    signing = by_name[podnames.pod_name("m", "sign", K2)]
    assert signing["spec"]["nodeSelector"] == {"pool": "container-level"}
    # Without a selector a pod names no node; a Module without tolerations
    # gives it none (in the sandbox: container nodes only, KWOK's carry a taint).
    plain = _plan(_view(_raw()), {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)})
    (creation,) = plain.create
    assert "nodeSelector" not in creation.pod["spec"]
    assert "tolerations" not in creation.pod["spec"]


def test_build_and_sign_pods_carry_the_modules_tolerations() -> None:
    raw = _raw()
    tolerations = [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "builds", "effect": "NoExecute", "tolerationSeconds": 30},
    ]  # fmt: skip
    raw["spec"]["tolerations"] = tolerations
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(MISSING, EXISTS)}
    made = {c.pod["metadata"]["labels"]["kmm.node.kubernetes.io/role"]: c.pod for c in _plan(_view(raw), facts).create}  # fmt: skip
    assert set(made) == {"build", "sign"}
    for pod in made.values():
        assert pod["spec"]["tolerations"] == tolerations
    # A toleration added while a pod waits to be scheduled replaces it.
    (before,) = _plan(
        _view(_raw()), {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    ).create
    pending = _pending(
        before.pod, unschedulable="0/3 nodes are available: 3 node(s) had untolerated taint {gpu: }"
    )
    found = _plan(
        _view(raw, [pending]), {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    )
    assert found.delete == [pending]


def _pending(
    pod: Obj, *, waiting: tuple[str, str] | None = None, unschedulable: str | None = None
) -> Obj:
    """``pod`` as the API server shows it while it cannot start: a container
    waiting for ``waiting`` (reason, message), or not scheduled."""
    found = copy.deepcopy(pod)
    found["metadata"]["uid"] = "u-pending"
    status: Obj = {"phase": "Pending"}
    if waiting is not None:
        reason, message = waiting
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        status["containerStatuses"] = [
            {
                "name": pod["spec"]["containers"][-1]["name"],
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
    if unschedulable is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        ]
    found["status"] = status
    return found


def _deleting(pod: Obj) -> Obj:
    found = copy.deepcopy(pod)
    found["metadata"]["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    return found


def _replaced(found: planner.BuildPlan) -> list[str]:
    return [e.message for e in found.events if e.reason in ("BuildReplaced", "SignReplaced")]


def test_a_running_build_whose_dockerfile_was_fixed_is_replaced() -> None:
    raw = _raw(sign=False)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    running = _running(creation.pod)
    fixed = build_inputs.Snapshot(
        versions={**INPUTS.versions, "ConfigMap/dockerfile": "50"},
        dockerfiles={"dockerfile": "FROM fixed\n"},
    )
    # Unchanged, it is waited for, and looked at again every poll (a fixed
    # ConfigMap sends the Module no event).
    waited = _plan(_view(raw, [running]), facts)
    assert (waited.create, waited.delete, waited.problems) == ([], [], [])
    assert waited.requeue_after == SETTINGS.poll
    found = _plan(_view(raw, [running]), facts, inputs=fixed)
    assert found.delete == [running]
    assert found.create == []  # the same name: once the old pod is gone
    assert found.gated == {K1}
    (told,) = _replaced(found)
    assert running["metadata"]["name"] in told
    assert "ConfigMap dockerfile" in told
    assert "the Dockerfile" in told
    assert {i.kernel: i.state for i in found.images}[K1] == "Building"
    # Being deleted: nothing is made meanwhile; gone: the new pod.
    going = _plan(_view(raw, [_deleting(running)]), facts, inputs=fixed, noticed=found.noticed)
    assert (going.create, going.delete, _replaced(going)) == ([], [], [])
    (again,) = _plan(_view(raw), facts, inputs=fixed).create
    assert hashing.of_pod(again.pod) != hashing.of_pod(running)


def test_sign_added_during_a_build_only_pod_replaces_it_before_it_pushes_unsigned() -> None:
    facts = {K1: images.Facts(MISSING, MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(_raw(sign=False)), facts).create
    assert _env(creation.pod, "KMM_IMAGE") == IMAGE1  # the final name, unsigned
    for before in (_running(creation.pod), _pending(creation.pod, unschedulable="no node")):
        found = _plan(_view(_raw(), [before]), facts)
        assert found.delete == [before]
        assert found.create == []
        (told,) = _replaced(found)
        assert f"the image it pushes ({IMAGE1} -> {images.intermediate_image(IMAGE1)})" in told
    (made,) = _plan(_view(_raw()), facts).create
    assert _env(made.pod, "KMM_IMAGE") == images.intermediate_image(IMAGE1)


def test_a_running_sign_whose_key_was_fixed_is_replaced() -> None:
    raw = _raw()
    facts = {K1: images.Facts(MISSING, EXISTS), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    running = _running(creation.pod)
    fixed = build_inputs.Snapshot(versions={**INPUTS.versions, "Secret/key": "60"}, dockerfiles=INPUTS.dockerfiles)  # fmt: skip
    found = _plan(_view(raw, [running]), {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}, inputs=fixed)  # fmt: skip
    assert found.delete == [running]
    (told,) = _replaced(found)
    assert "Secret key" in told
    assert [e.reason for e in found.events] == ["SignReplaced"]


@pytest.mark.parametrize(
    ("waiting", "reason"),
    [
        (("ImagePullBackOff", 'Back-off pulling image "b.io/builder:1"'), "ImagePullBackOff"),
        (("ErrImagePull", "pull access denied"), "ErrImagePull"),
        (("CreateContainerConfigError", 'secret "repo" not found'), "CreateContainerConfigError"),
    ],
)
def test_a_pod_stuck_before_it_starts_is_shown_and_replaced_once_its_pull_secret_is_fixed(
    waiting: tuple[str, str], reason: str
) -> None:
    raw = _raw(sign=False)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    stuck = _pending(creation.pod, waiting=waiting)
    found = _plan(_view(raw, [stuck]), facts)
    assert (found.create, found.delete) == ([], [])
    (problem,) = found.problems
    assert problem.reason == reason
    assert stuck["metadata"]["name"] in problem.message
    assert waiting[1] in problem.message
    image = {i.kernel: i for i in found.images}[K1]
    assert image.state == "Building"
    assert image.message is not None
    assert reason in image.message
    assert waiting[1] in image.message
    assert [(e.type, e.reason) for e in found.events] == [("Warning", reason)]
    assert found.requeue_after == SETTINGS.poll
    again = _plan(_view(raw, [stuck]), facts, noticed=found.noticed)
    assert again.events == []  # told once
    assert [p.reason for p in again.problems] == [reason]  # shown while it lasts
    fixed = build_inputs.Snapshot(versions={**INPUTS.versions, "Secret/repo": "80"}, dockerfiles=INPUTS.dockerfiles)  # fmt: skip
    replaced = _plan(_view(raw, [stuck]), facts, inputs=fixed)
    assert replaced.delete == [stuck]
    assert replaced.problems == []


def test_an_unschedulable_pod_is_shown_and_replaced_once_its_selector_is_fixed() -> None:
    raw = _raw(sign=False)
    raw["spec"]["moduleLoader"]["container"]["build"]["selector"] = {"pool": "none"}
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    why = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    stuck = _pending(creation.pod, unschedulable=why)
    found = _plan(_view(raw, [stuck]), facts)
    assert (found.create, found.delete) == ([], [])
    (problem,) = found.problems
    assert (problem.reason, why in problem.message) == ("Unschedulable", True)
    assert "Unschedulable" in ({i.kernel: i for i in found.images}[K1].message or "")
    raw["spec"]["moduleLoader"]["container"]["build"]["selector"] = {"pool": "builders"}
    replaced = _plan(_view(raw, [stuck]), facts)
    assert replaced.delete == [stuck]
    assert [e.reason for e in replaced.events] == ["BuildReplaced"]
    assert "the pod's spec" in replaced.events[0].message


def test_a_pod_still_creating_its_container_is_not_a_problem() -> None:
    raw = _raw(sign=False)
    facts = {K1: images.Facts(MISSING), K2: images.Facts(EXISTS)}
    (creation,) = _plan(_view(raw), facts).create
    creating = _pending(creation.pod, waiting=("ContainerCreating", ""))
    found = _plan(_view(raw, [creating]), facts)
    assert (found.create, found.delete, found.problems, found.events) == ([], [], [], [])
