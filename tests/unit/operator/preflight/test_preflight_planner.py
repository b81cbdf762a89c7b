"""The preflight planner, table by table: from Modules, registry facts,
inputs and observed preflight pods to verdicts, pods and the status."""

from __future__ import annotations

import copy
import json
from typing import Any

import operator_fixtures as fixtures
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmm.api import labels, preflight
from kmm.operator.build import existence, hashing, images, podnames
from kmm.operator.build import inputs as build_inputs
from kmm.operator.build import settings as build_settings
from kmm.operator.preflight import planner, status, verdicts

Obj = dict[str, Any]
KERNEL = "6.8.0-45-generic"
IMAGE = "r.io/m:6.8.0-45-generic"
UID = "pfv-uid"
EXISTS = existence.Fact(existence.State.EXISTS)
MISSING = existence.Fact(existence.State.MISSING, f"{IMAGE} does not exist")
AUTH = existence.Fact(existence.State.AUTH_FAILED, "r.io/m: unauthorized")
ERROR = existence.Fact(existence.State.ERROR, "r.io: connection refused")
SETTINGS = build_settings.Settings(builder_image="b.io/builder:1", poll=7.0)
INPUTS = build_inputs.Snapshot(
    versions={
        "ConfigMap/dockerfile": "5",
        "Secret/key": "6",
        "Secret/cert": "7",
        "Secret/repo": "8",
    },
    dockerfiles={"dockerfile": "FROM scratch\n"},
)
NOW = "2026-12-02T12:00:00Z"
EARLIER = "2026-12-01T08:00:00Z"


def validation_raw(
    kernel: str = KERNEL,
    *,
    push: bool = False,
    generation: int = 1,
    status: Obj | None = None,
    name: str = "pfv",
) -> Obj:
    found: Obj = {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "metadata": {"name": name, "uid": UID, "generation": generation, "resourceVersion": "3"},
        "spec": {"kernelVersion": kernel, "pushBuiltImage": push},
    }
    if status is not None:
        found["status"] = status
    return found


def validation(**options: Any) -> preflight.PreflightValidation:
    return preflight.parse(validation_raw(**options))


def module_raw(name: str = "m", namespace: str = "ns", *, build: bool = False, sign: bool = False, **spec: Any) -> Obj:  # fmt: skip
    container: Obj = {
        "modprobe": {"moduleName": "kmod_x"},
        "kernelMappings": [{"literal": KERNEL, "containerImage": "r.io/m:${KERNEL_FULL_VERSION}"}],
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
        name,
        namespace,
        moduleLoader={"container": container},
        imageRepoSecret={"name": "repo"},
        **spec,
    )


def subject(raw: Obj, kernel: str = KERNEL) -> verdicts.Subject:
    (found,) = verdicts.subjects(kernel, [raw])
    return found


def wanted_pod(found: preflight.PreflightValidation, raw: Obj, inputs: build_inputs.Snapshot = INPUTS) -> Obj:  # fmt: skip
    pod, missing = planner.desired(found, subject(raw, preflight.kernel(found)), inputs, SETTINGS)
    assert pod is not None, missing
    return pod


def observed(pod: Obj, phase: str, *, message: str = "", init_message: str = "", uid: str = "p1", exit_code: int = 0) -> Obj:  # fmt: skip
    """``pod`` as the cache would show it after it got to ``phase``."""
    found = copy.deepcopy(pod)
    found["metadata"]["uid"] = uid
    found["status"] = {"phase": phase}
    if phase in ("Succeeded", "Failed"):
        found["status"]["containerStatuses"] = [
            {"name": "sign", "state": {"terminated": {"exitCode": exit_code, "message": message}}}
        ]
        if init_message:
            found["status"]["initContainerStatuses"] = [
                {"name": "build", "state": {"terminated": {"exitCode": 1, "message": init_message}}}
            ]
            found["status"]["containerStatuses"] = [
                {"name": "sign", "state": {"waiting": {"reason": "PodInitializing"}}}
            ]
    return found


def run(
    found: preflight.PreflightValidation,
    raws: list[Obj],
    *,
    facts: dict[str, images.Facts] | None = None,
    inputs: dict[str, build_inputs.Snapshot] | None = None,
    pods_: list[Obj] = (),  # type: ignore[assignment]
) -> planner.Plan:
    judged = verdicts.subjects(preflight.kernel(found), raws)
    return planner.plan(
        found,
        judged,
        observed=list(pods_),
        facts=facts or {},
        inputs=inputs if inputs is not None else {s.key: INPUTS for s in judged},
        settings=SETTINGS,
    )


# -- subjects: verdicts reached without the registry ------------------------


def test_modules_are_resolved_for_the_trimmed_kernel_sorted_deleting_ones_left_out() -> None:
    going = module_raw("c")
    going["metadata"]["deletionTimestamp"] = "2026-12-02T11:00:00Z"
    found = verdicts.subjects(KERNEL, [module_raw("b", "z"), going, module_raw("a", "z"), module_raw("x", "a")])  # fmt: skip
    assert [s.key for s in found] == ["a/x", "z/a", "z/b"]
    (plus,) = verdicts.subjects(preflight.kernel(validation(kernel=KERNEL + "+")), [module_raw()])
    assert plus.target is not None
    assert plus.target.image == IMAGE


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (fixtures.module_raw(moduleLoader=None, devicePlugin={"container": {"image": "r.io/dp:1"}}),
         "Success", preflight.REASON_NO_IMAGE_NEEDED),
        (module_raw(), None, None),
        ({**module_raw(), "spec": {**module_raw()["spec"], "selector": "not a map"}},
         "Failure", "the Module is invalid: "),
    ],
)  # fmt: skip
def test_a_verdict_without_the_registry(raw: Obj, status: str | None, reason: str | None) -> None:
    found = subject(raw)
    if status is None:
        assert found.verdict is None
        assert found.target is not None
        return
    assert found.verdict is not None
    assert found.verdict.status == status
    assert found.verdict.reason.startswith(str(reason))


def test_a_kernel_no_mapping_matches_is_mapping_not_found() -> None:
    plan = run(validation(kernel="5.10.0-1-amd64"), [module_raw(build=True)])
    assert plan.verdicts["ns/m"] == verdicts.Verdict("Failure", "Done", preflight.REASON_MAPPING_NOT_FOUND)  # fmt: skip
    assert plan.create == []


# -- the registry's answer ---------------------------------------------------


@pytest.mark.parametrize(
    ("build", "final", "status", "stage", "reason"),
    [
        (False, EXISTS, "Success", "Done", preflight.REASON_IMAGE_EXISTS),
        (True, EXISTS, "Success", "Done", preflight.REASON_IMAGE_EXISTS),
        (False, MISSING, "Failure", "Done", preflight.REASON_IMAGE_MISSING),
        (True, AUTH, "Failure", "Done", "image existence could not be verified: r.io/m: unauthorized"),
        (False, ERROR, "InProgress", "Image", preflight.REASON_IN_PROGRESS + ": r.io: connection refused"),
        (True, MISSING, "InProgress", "Image", preflight.REASON_IN_PROGRESS),
    ],
)  # fmt: skip
def test_the_registry_answer_decides(
    build: bool, final: existence.Fact, status: str, stage: str, reason: str
) -> None:
    found = validation()
    plan = run(found, [module_raw(build=build)], facts={"ns/m": images.Facts(final)})
    verdict = plan.verdicts["ns/m"]
    assert (verdict.status, verdict.stage, verdict.reason) == (status, stage, reason)
    assert verdict.image == IMAGE
    if build and final is MISSING:
        (pod,) = plan.create
        assert pod["metadata"]["name"] == podnames.preflight_pod_name("pfv", "m") == verdict.pod
        assert pod["metadata"]["namespace"] == "ns"
        assert pod["metadata"]["labels"][labels.PREFLIGHT] == "pfv"
        assert pod["metadata"]["ownerReferences"] == [planner.owner_reference(found)]
        assert hashing.of_pod(pod) is not None
    else:
        assert plan.create == []
        assert verdict.pod is None
    assert plan.delete == []


def test_the_owner_reference_is_the_validation_as_controller() -> None:
    assert planner.owner_reference(validation()) == {
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta2",
        "kind": "PreflightValidation",
        "name": "pfv",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_missing_inputs_fail_naming_them_and_are_looked_at_again() -> None:
    plan = run(
        validation(),
        [module_raw(build=True, sign=True)],
        facts={"ns/m": images.Facts(MISSING)},
        inputs={"ns/m": build_inputs.Snapshot(versions={"Secret/repo": "1", "Secret/key": "2"})},
    )
    verdict = plan.verdicts["ns/m"]
    assert verdict.status == "Failure"
    assert verdict.reason == (
        f"{preflight.REASON_BUILD_FAILED}: ConfigMap ns/dockerfile does not exist; "
        "Secret ns/cert does not exist"
    )
    assert plan.create == []
    assert plan.requeue_after == SETTINGS.poll


def test_a_preflight_build_gets_dtk_auto_or_fails_naming_the_flag() -> None:
    dtk = build_inputs.Snapshot(
        versions=INPUTS.versions, dockerfiles={"dockerfile": "ARG DTK_AUTO\nFROM ${DTK_AUTO}\n"}
    )
    raw = module_raw(build=True, sign=True)
    facts = {"ns/m": images.Facts(MISSING)}
    plan = run(validation(), [raw], facts=facts, inputs={"ns/m": dtk})
    verdict = plan.verdicts["ns/m"]
    assert (verdict.status, plan.create) == ("Failure", [])
    assert verdict.reason.startswith(f"{preflight.REASON_BUILD_FAILED}: the Dockerfile declares")
    assert "--driver-toolkit-image" in verdict.reason
    with_template = build_settings.Settings(
        builder_image="b.io/builder:1", driver_toolkit_image="r.io/dtk:${KERNEL_FULL_VERSION}"
    )
    pod, missing = planner.desired(validation(), subject(raw), dtk, with_template)
    assert pod is not None, missing
    (build,) = pod["spec"]["initContainers"]
    assert build["command"][-1] == f"--build-arg=DTK_AUTO=r.io/dtk:{KERNEL}"


@pytest.mark.parametrize(
    ("unsigned", "status", "created"),
    [
        (None, "InProgress", False),
        (MISSING, "Failure", False),
        (EXISTS, "InProgress", True),
        (AUTH, "Failure", False),
    ],
)
def test_sign_without_build_waits_for_the_unsigned_image(
    unsigned: existence.Fact | None, status: str, created: bool
) -> None:
    plan = run(
        validation(),
        [module_raw(sign=True)],
        facts={"ns/m": images.Facts(MISSING, unsigned)},
    )
    verdict = plan.verdicts["ns/m"]
    assert verdict.status == status
    assert bool(plan.create) is created
    if unsigned is MISSING:
        assert "sign.unsignedImage r.io/unsigned:6.8.0-45-generic does not exist" in verdict.reason
        assert plan.requeue_after == SETTINGS.poll


def test_what_the_reconciler_asks_for() -> None:
    found = validation()
    sign_only = subject(module_raw(sign=True))
    assert sign_only.target is not None
    assert planner.inputs_wanted(sign_only) == ["Secret/repo", "Secret/key", "Secret/cert"]
    assert planner.inputs_wanted(subject(module_raw())) == []
    assert planner.unsigned_wanted(sign_only.target, MISSING)
    assert not planner.unsigned_wanted(sign_only.target, EXISTS)
    both = subject(module_raw(build=True, sign=True))
    assert both.target is not None
    assert not planner.unsigned_wanted(both.target, MISSING)
    # No pod: the registry decides; no target: nobody asks.
    assert planner.asks_registry(found, both, [], None, SETTINGS)
    assert not planner.asks_registry(found, subject(module_raw(), "1.2.3"), [], None, SETTINGS)


# -- kept pods: the record of a verdict --------------------------------------


def test_a_succeeded_pod_is_the_verdict_without_the_registry() -> None:
    found = validation()
    raw = module_raw(build=True, sign=True)
    done = observed(wanted_pod(found, raw), "Succeeded", message='{"image": "x", "pushed": false}')
    assert not planner.asks_registry(found, subject(raw), [done], INPUTS, SETTINGS)
    plan = run(found, [raw], pods_=[done])
    verdict = plan.verdicts["ns/m"]
    assert verdict == verdicts.Verdict(
        "Success",
        "Done",
        f"{preflight.REASON_BUILT}; the image was not pushed (pushBuiltImage is false)",
        image=IMAGE,
        pod=podnames.preflight_pod_name("pfv", "m"),
    )
    assert (plan.create, plan.delete, plan.pushed) == ([], [], {})


def test_a_pod_that_pushed_says_so_and_its_image_is_to_be_asked_again() -> None:
    found = validation(push=True)
    raw = module_raw(build=True)
    done = observed(wanted_pod(found, raw), "Succeeded", message=json.dumps({"pushed": True}), uid="u9")  # fmt: skip
    plan = run(found, [raw], pods_=[done])
    assert plan.verdicts["ns/m"].reason == f"{preflight.REASON_BUILT}; pushed {IMAGE}"
    assert plan.pushed == {"u9": IMAGE}


@pytest.mark.parametrize(
    ("message", "init_message", "tail"),
    [
        ("line1\nline2\nbuild failed", "", "line1\nline2\nbuild failed"),
        ("", "kmm-build: error: buildah build failed", "kmm-build: error: buildah build failed"),
        ("\n".join(f"l{i}" for i in range(10)), "", "\n".join(f"l{i}" for i in range(4, 10))),
        ("", "", "no termination message (exit code 2)"),
    ],
)
def test_a_failed_pod_is_a_failure_naming_it_and_is_kept(message: str, init_message: str, tail: str) -> None:  # fmt: skip
    found = validation()
    raw = module_raw(build=True, sign=True)
    failed = observed(wanted_pod(found, raw), "Failed", message=message, init_message=init_message, exit_code=2)  # fmt: skip
    plan = run(found, [raw], pods_=[failed])
    name = podnames.preflight_pod_name("pfv", "m")
    verdict = plan.verdicts["ns/m"]
    assert verdict.status == "Failure"
    assert verdict.reason == f"{preflight.REASON_BUILD_FAILED}: pod ns/{name} failed: {tail}"
    assert verdict.pod == name
    assert (plan.create, plan.delete) == ([], [])
    assert plan.requeue_after == SETTINGS.poll  # fixed inputs send no event


def test_a_running_pod_is_in_progress_and_kept() -> None:
    found = validation()
    raw = module_raw(build=True)
    plan = run(found, [raw], pods_=[observed(wanted_pod(found, raw), "Running")])
    verdict = plan.verdicts["ns/m"]
    assert (verdict.status, verdict.stage, verdict.pod) == ("InProgress", "Image", podnames.preflight_pod_name("pfv", "m"))  # fmt: skip
    assert (plan.create, plan.delete) == ([], [])


@pytest.mark.parametrize(
    "change",
    ["dockerfile", "secret", "kernel", "push", "build args"],
)
def test_a_pod_whose_inputs_changed_is_deleted_then_made_again(change: str) -> None:
    found = validation()
    raw = module_raw(build=True, sign=True)
    failed = observed(wanted_pod(found, raw), "Failed", message="boom", exit_code=1)
    now_found, now_raw, now_inputs = found, raw, INPUTS
    if change == "dockerfile":
        now_inputs = build_inputs.Snapshot(INPUTS.versions, {"dockerfile": "FROM busybox\n"})
    elif change == "secret":
        now_inputs = build_inputs.Snapshot(
            {**INPUTS.versions, "Secret/key": "60"}, INPUTS.dockerfiles
        )
    elif change == "kernel":
        now_found = validation(kernel="6.8.0-45-generic-2", generation=2)
        now_raw = copy.deepcopy(raw)
        now_raw["spec"]["moduleLoader"]["container"]["kernelMappings"][0] = {"regexp": "^6\\.8\\.", "containerImage": "r.io/m:${KERNEL_FULL_VERSION}"}  # fmt: skip
        failed = observed(wanted_pod(found, now_raw), "Failed", message="boom", exit_code=1)
    elif change == "push":
        now_found = validation(push=True, generation=2)
    else:
        now_raw = copy.deepcopy(raw)
        now_raw["spec"]["moduleLoader"]["container"]["build"]["buildArgs"] = [{"name": "A", "value": "1"}]  # fmt: skip
    facts = {"ns/m": images.Facts(MISSING)}
    plan = run(now_found, [now_raw], pods_=[failed], facts=facts, inputs={"ns/m": now_inputs})
    assert plan.delete == [failed]
    assert plan.create == []  # same name: made once the old one is gone
    assert plan.verdicts["ns/m"].status == "InProgress"
    assert "waiting for the old pod" in plan.verdicts["ns/m"].reason
    gone = run(now_found, [now_raw], facts=facts, inputs={"ns/m": now_inputs})
    (made,) = gone.create
    assert hashing.of_pod(made) != hashing.of_pod(failed)


def test_a_kept_pod_whose_image_now_exists_elsewhere_is_stale_once_inputs_change() -> None:
    found = validation()
    raw = module_raw(build=True)
    failed = observed(wanted_pod(found, raw), "Failed", message="boom", exit_code=1)
    changed = build_inputs.Snapshot(
        {**INPUTS.versions, "ConfigMap/dockerfile": "9"}, INPUTS.dockerfiles
    )
    plan = run(found, [raw], pods_=[failed], facts={"ns/m": images.Facts(EXISTS)}, inputs={"ns/m": changed})  # fmt: skip
    assert plan.verdicts["ns/m"].reason == preflight.REASON_IMAGE_EXISTS
    assert plan.verdicts["ns/m"].pod is None
    assert plan.delete == [failed]


def test_the_pods_of_deleted_modules_or_modules_that_no_longer_build_are_deleted() -> None:
    found = validation()
    raw = module_raw(build=True)
    pod = observed(wanted_pod(found, raw), "Succeeded")
    plan = run(found, [], pods_=[pod])
    assert plan.delete == [pod]
    assert plan.verdicts == {}
    no_build = run(found, [module_raw()], pods_=[pod], facts={"ns/m": images.Facts(EXISTS)})
    assert no_build.delete == [pod]


def test_terminating_and_foreign_pods_are_waited_for_not_deleted() -> None:
    found = validation()
    raw = module_raw(build=True)
    facts = {"ns/m": images.Facts(MISSING)}
    going = observed(wanted_pod(found, raw), "Failed", message="x", exit_code=1)
    going["metadata"]["deletionTimestamp"] = "2026-12-02T11:00:00Z"
    earlier = observed(wanted_pod(found, raw), "Succeeded")
    earlier["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-validation"
    for pod in (going, earlier):
        plan = run(found, [raw], pods_=[pod], facts=facts)
        assert (plan.create, plan.delete) == ([], [])
        assert plan.verdicts["ns/m"].status == "InProgress"
        # Neither is the Module's record: the registry is asked.
        assert planner.asks_registry(found, subject(raw), [pod], INPUTS, SETTINGS)


def test_a_pod_elsewhere_or_not_controlled_by_the_validation_is_not_its_record() -> None:
    """A Succeeded pod labelled for the validation and the Module ``ns/m``,
    in a tenant's namespace even with the validation as controller, or in
    ``ns`` naming it only as a non-controlling owner: neither decides the
    Module's verdict, and the one elsewhere neither blocks its own pod nor
    is deleted as the validation's."""
    found = validation()
    raw = module_raw(build=True)
    facts = {"ns/m": images.Facts(MISSING)}
    elsewhere = observed(wanted_pod(found, raw), "Succeeded", uid="tenant-pod")
    elsewhere["metadata"]["namespace"] = "tenant"
    not_controller = observed(wanted_pod(found, raw), "Succeeded", uid="loose")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert planner.observed_pod(found, subject(raw), [elsewhere]) is None
    assert planner.observed_pod(found, subject(raw), [not_controller]) is None
    plan = run(found, [raw], pods_=[elsewhere], facts=facts)
    assert plan.verdicts["ns/m"].status == "InProgress"
    assert [p["metadata"]["namespace"] for p in plan.create] == ["ns"]
    assert plan.delete == []  # the tenant's: not the validation's to delete either
    blocked = run(found, [raw], pods_=[not_controller], facts=facts)
    assert (blocked.create, blocked.delete) == ([], [])  # its name is taken: waited for
    assert blocked.verdicts["ns/m"].status == "InProgress"


def test_modules_of_one_name_in_two_namespaces_have_a_pod_each() -> None:
    found = validation()
    raws = [module_raw("m", "a", build=True), module_raw("m", "b", build=True)]
    plan = run(found, raws, facts={"a/m": images.Facts(MISSING), "b/m": images.Facts(MISSING)})  # fmt: skip
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in plan.create) == [
        ("a", podnames.preflight_pod_name("pfv", "m")),
        ("b", podnames.preflight_pod_name("pfv", "m")),
    ]
    kept = [observed(p, "Running", uid=p["metadata"]["namespace"]) for p in plan.create]
    again = run(found, raws, pods_=kept)
    assert (again.create, again.delete) == ([], [])


# -- the status ----------------------------------------------------------------


def _entry(name: str, status: str, stage: str, reason: str, time: str = EARLIER) -> Obj:
    return {
        "name": name,
        "namespace": "ns",
        "verificationStatus": status,
        "verificationStage": stage,
        "statusReason": reason,
        "lastTransitionTime": time,
    }


@pytest.mark.parametrize(
    ("before", "generation", "verdict", "time"),
    [
        # Same verdict: the time stays.
        (_entry("m", "Success", "Done", preflight.REASON_IMAGE_EXISTS), 1,
         verdicts.Verdict("Success", "Done", preflight.REASON_IMAGE_EXISTS, image=IMAGE), EARLIER),
        # A reason change alone keeps it.
        (_entry("m", "InProgress", "Image", preflight.REASON_IN_PROGRESS), 1,
         verdicts.Verdict("InProgress", "Image", preflight.REASON_IN_PROGRESS + ": x"), EARLIER),
        # The verdict changed.
        (_entry("m", "InProgress", "Image", preflight.REASON_IN_PROGRESS), 1,
         verdicts.Verdict("Success", "Done", preflight.REASON_BUILT), NOW),
        # The spec changed: every verdict starts over.
        (_entry("m", "Success", "Done", preflight.REASON_IMAGE_EXISTS), 2,
         verdicts.Verdict("Success", "Done", preflight.REASON_IMAGE_EXISTS), NOW),
        # A new Module.
        (_entry("other", "Success", "Done", preflight.REASON_IMAGE_EXISTS), 1,
         verdicts.Verdict("Success", "Done", preflight.REASON_IMAGE_EXISTS), NOW),
    ],
)  # fmt: skip
def test_last_transition_time_moves_only_with_the_verdict(
    before: Obj, generation: int, verdict: verdicts.Verdict, time: str
) -> None:
    raw = validation_raw(
        generation=generation, status={"modules": [before], "observedGeneration": 1}
    )
    wanted = status.compute(preflight.parse(raw), {"ns/m": verdict}, now=NOW)
    (entry,) = wanted["modules"]
    assert entry["lastTransitionTime"] == time
    assert entry["statusReason"] == verdict.reason
    assert wanted["observedGeneration"] == generation
    assert ("image" in entry) is (verdict.image is not None)
    assert "pod" not in entry


def test_a_status_that_is_already_there_is_not_written_again() -> None:
    found = validation()
    found_verdicts = {
        "ns/b": verdicts.Verdict("Failure", "Done", preflight.REASON_MAPPING_NOT_FOUND),
        "ns/a": verdicts.Verdict(
            "InProgress", "Image", preflight.REASON_IN_PROGRESS, image=IMAGE, pod="pfv-a"
        ),
    }
    wanted = status.compute(found, found_verdicts, now=NOW)
    assert [e["name"] for e in wanted["modules"]] == ["a", "b"]
    assert wanted["modules"][0]["pod"] == "pfv-a"
    raw = validation_raw(status=copy.deepcopy(wanted))
    assert not status.differs(raw, status.compute(preflight.parse(raw), found_verdicts, now="2027-01-01T00:00:00Z"))  # fmt: skip
    assert status.differs(validation_raw(), wanted)
    # A deleted Module's entry goes.
    fewer = status.compute(preflight.parse(raw), {"ns/a": found_verdicts["ns/a"]}, now=NOW)
    assert [e["name"] for e in fewer["modules"]] == ["a"]
    assert status.differs(raw, fewer)
    # What the planner writes, the API's model reads.
    preflight.PreflightValidationStatus.model_validate(wanted)


# -- properties over every combination ------------------------------------------


_FACTS = st.sampled_from([None, EXISTS, MISSING, AUTH, ERROR])
_PHASES = st.sampled_from([None, "Pending", "Running", "Succeeded", "Failed", "deleting", "foreign", "stale"])  # fmt: skip
_KINDS = st.sampled_from(["none", "build", "sign", "both", "unmapped", "no-loader"])


def _module_of(kind: str, name: str) -> Obj:
    if kind == "no-loader":
        return fixtures.module_raw(name, "ns", moduleLoader=None, devicePlugin={"container": {"image": "r.io/dp:1"}})  # fmt: skip
    raw = module_raw(name, build=kind in ("build", "both"), sign=kind in ("sign", "both"))
    if kind == "unmapped":
        raw["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["literal"] = "1.2.3"
    return raw


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_KINDS, _FACTS, _FACTS, _PHASES), min_size=1, max_size=4),
    st.booleans(),
    st.booleans(),
)
def test_every_module_gets_one_consistent_verdict_and_no_pod_is_both_made_and_deleted(
    cases: list[tuple[str, existence.Fact | None, existence.Fact | None, str | None]],
    push: bool,
    inputs_there: bool,
) -> None:
    found = validation(push=push)
    raws, facts, observed_pods = [], {}, []
    for index, (kind, final, unsigned, phase) in enumerate(cases):
        name = f"m{index}"
        raw = _module_of(kind, name)
        raws.append(raw)
        facts[f"ns/{name}"] = images.Facts(final, unsigned) if final is not None else None
        if phase is not None and kind in ("build", "sign", "both"):
            pod = observed(wanted_pod(found, raw), "Failed" if phase in ("deleting", "foreign", "stale") else phase, message="x", uid=name)  # fmt: skip
            if phase == "deleting":
                pod["metadata"]["deletionTimestamp"] = NOW
            elif phase == "foreign":
                pod["metadata"]["ownerReferences"][0]["uid"] = "other"
            elif phase == "stale":
                pod = hashing.stamp(pod, {"pod": "stale"})
            observed_pods.append(pod)
    judged = verdicts.subjects(KERNEL, raws)
    plan = planner.plan(
        found,
        judged,
        observed=observed_pods,
        facts={k: v for k, v in facts.items() if v is not None},
        inputs={s.key: INPUTS for s in judged} if inputs_there else {},
        settings=SETTINGS,
    )
    assert set(plan.verdicts) == {s.key for s in judged}
    for verdict in plan.verdicts.values():
        assert verdict.stage == ("Image" if verdict.status == "InProgress" else "Done")
    made = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in plan.create}
    gone = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in plan.delete}
    shown = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in observed_pods}
    assert not made & shown  # never over a pod the cache still shows
    assert not made & gone
    for pod in plan.delete:
        assert pod["metadata"]["ownerReferences"][0]["uid"] == UID
        assert not pod["metadata"].get("deletionTimestamp")
    for pod in plan.create:
        assert plan.verdicts[f"ns/{pod['metadata']['labels'][labels.MODULE_NAME]}"].status == "InProgress"  # fmt: skip
    written = status.compute(found, plan.verdicts, now=NOW)
    preflight.PreflightValidationStatus.model_validate(written)


def test_a_preflight_pod_carries_the_modules_tolerations_and_a_new_one_replaces_it() -> None:
    found = validation()
    tolerations = [{"key": "builders", "operator": "Exists", "effect": "NoSchedule"}]
    raw = module_raw(build=True, sign=True, tolerations=tolerations)
    pod = wanted_pod(found, raw)
    assert pod["spec"]["tolerations"] == tolerations
    assert "tolerations" not in wanted_pod(found, module_raw(build=True, sign=True))["spec"]
    # Waiting to be scheduled, made before the toleration: replaced.
    before = observed(wanted_pod(found, module_raw(build=True, sign=True)), "Pending")
    plan = run(found, [raw], pods_=[before], facts={"ns/m": images.Facts(MISSING)})
    assert plan.delete == [before]
    assert plan.create == []
