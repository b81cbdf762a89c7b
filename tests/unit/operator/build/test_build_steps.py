"""The per-kernel state machine (``steps.next_step``), as a table: facts,
observed pods and what the Module asks for in, one step out; and what an
image's labels say of it (``images.outdated``, ``images.signable``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import test_build_planner as cases

from kmm.api import kernels, labels
from kmm.operator.build import existence, images, scripts, steps
from kmm.operator.loader import planner as loader_planner

WANTED = images.Wanted(build="b1", trigger="", sign="s1", cert="c1")
BUILT = {labels.IMAGE_BUILD_HASH: "b1", labels.IMAGE_REBUILD_TRIGGER: ""}
SIGNED = {
    **BUILT,
    labels.IMAGE_SIGNED: "true",
    labels.IMAGE_SIGNING_CERT: "c1",
    labels.IMAGE_SIGN_HASH: "s1",
}
EXISTS = existence.Fact(existence.State.EXISTS, digest="sha256:" + "e" * 64, labels={})
INTERMEDIATE = dataclasses.replace(EXISTS, labels=BUILT)
OLDER = dataclasses.replace(EXISTS, labels={**BUILT, labels.IMAGE_BUILD_HASH: "b0"})
EARLIER_PASS = dataclasses.replace(EXISTS, labels={**BUILT, labels.IMAGE_REBUILD_TRIGGER: "1"})
UNKNOWN = dataclasses.replace(EXISTS, labels=None, node="n1")  # a node's verdict
MISSING = existence.Fact(existence.State.MISSING)
REFUSED = existence.Fact(existence.State.AUTH_FAILED, "refused")
SILENT = existence.Fact(existence.State.ERROR, "no answer")
UNDECIDED = existence.Fact(existence.State.AUTH_FAILED, "wants credentials", undecided=True)
PENDING = dataclasses.replace(UNDECIDED, pending=True)
RUNNING: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
FAILED = cases._ended({"metadata": {"name": "p"}}, "Failed", "bad key", exit_code=1)
STALE = cases._ended({"metadata": {"name": "p"}}, "Failed", "stale", exit_code=scripts.STALE_EXIT)


def _target(*, build: bool = True, sign: bool = True) -> kernels.Target:
    view = cases._view(cases._raw(build=build, sign=sign))
    return loader_planner.grouping(view).targets[cases.K1]


BOTH, BUILD, SIGN = _target(), _target(sign=False), _target(build=False)
UNSIGNED_OF_BOTH = images.intermediate_image(cases.IMAGE1)
WHY = ["it is not signed"]


@pytest.mark.parametrize(
    ("target", "facts", "sign_pod", "outdated", "expected"),
    [
        (BOTH, images.Facts(EXISTS), None, [], steps.Step("exists", finish=steps.ROLES)),
        (BOTH, images.Facts(REFUSED), None, [], steps.Step("blocked", fact=REFUSED, image=cases.IMAGE1)),
        (BOTH, images.Facts(SILENT), None, [], steps.Step("blocked", fact=SILENT, image=cases.IMAGE1)),
        (BOTH, images.Facts(UNDECIDED), None, [], steps.Step("asking", fact=UNDECIDED, image=cases.IMAGE1)),
        (BOTH, images.Facts(PENDING), None, [], steps.Step("blocked", fact=PENDING, image=cases.IMAGE1)),
        (BUILD, images.Facts(MISSING), None, [], steps.Step("run", "build")),
        (BUILD, images.Facts(EXISTS), None, ["it was built from other inputs"], steps.Step("run", "build")),
        (BOTH, images.Facts(EXISTS), None, WHY, steps.Step("checking")),
        (BOTH, images.Facts(EXISTS, MISSING), None, WHY, steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING), None, [], steps.Step("checking")),
        (BOTH, images.Facts(MISSING, MISSING), None, [], steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, INTERMEDIATE), None, [], steps.Step("run", "sign", finish=("build",))),
        (BOTH, images.Facts(MISSING, OLDER), None, [], steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, EARLIER_PASS), None, [], steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, dataclasses.replace(EXISTS, labels={})), None, [], steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, UNKNOWN), None, [], steps.Step("run", "sign", finish=("build",))),
        (BOTH, images.Facts(MISSING, REFUSED), None, [], steps.Step("blocked", fact=REFUSED, image=UNSIGNED_OF_BOTH)),
        (BOTH, images.Facts(MISSING, UNDECIDED), None, [], steps.Step("asking", fact=UNDECIDED, image=UNSIGNED_OF_BOTH)),
        (BOTH, images.Facts(MISSING), RUNNING, [], steps.Step("run", "sign")),
        (BOTH, images.Facts(MISSING, INTERMEDIATE), FAILED, [], steps.Step("run", "sign", finish=("build",))),
        (BOTH, images.Facts(MISSING, OLDER), FAILED, [], steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, UNKNOWN), STALE, [], steps.Step("run", "build", finish=("sign",))),
        (SIGN, images.Facts(MISSING, MISSING), None, [], steps.Step("awaiting", image=f"r.io/unsigned:{cases.K1}")),
        (SIGN, images.Facts(MISSING, EXISTS), None, [], steps.Step("run", "sign")),
        (SIGN, images.Facts(EXISTS, EXISTS), None, WHY, steps.Step("run", "sign")),
        (SIGN, images.Facts(MISSING), FAILED, [], steps.Step("run", "sign")),
    ],
    ids=[
        "final-exists", "final-refused", "final-unanswered", "final-undecided-asks-a-node",
        "final-undecided-being-asked", "build-only", "build-only-outdated-builds",
        "outdated-asks-the-unsigned", "outdated-builds", "unsigned-not-asked",
        "unsigned-missing-builds", "unsigned-of-this-build-signs", "unsigned-of-other-inputs-builds",
        "unsigned-of-an-earlier-pass-builds", "unsigned-unlabelled-builds",
        "unsigned-labels-unknown-the-sign-checks", "unsigned-refused", "unsigned-undecided",
        "a-running-sign-runs-to-its-end", "a-failed-sign-is-retried-as-a-sign",
        "a-failed-sign-of-a-stale-unsigned-builds", "a-sign-that-found-its-input-stale-builds",
        "sign-only-awaits-its-image", "sign-only-signs", "sign-only-outdated-signs-again",
        "sign-only-pod-runs-to-its-end",
    ],
)  # fmt: skip
def test_the_next_step(
    target: kernels.Target,
    facts: images.Facts,
    sign_pod: dict[str, Any] | None,
    outdated: list[str],
    expected: steps.Step,
) -> None:
    observed = {"build": None, "sign": sign_pod}
    found = steps.next_step(target, facts, observed, outdated=outdated, wanted=WANTED)
    assert found == expected


@pytest.mark.parametrize(
    ("target", "found", "why"),
    [
        (BOTH, SIGNED, []),
        (BOTH, None, []),  # not known (a node's verdict): taken as it is
        (BOTH, {}, []),  # not made by kmm: taken as it is
        (BOTH, {**SIGNED, labels.IMAGE_REBUILD_TRIGGER: "7"}, []),  # a pass rebuilds no final image
        (BOTH, BUILT, ["it is not signed"]),
        (BOTH, {**SIGNED, labels.IMAGE_BUILD_HASH: "b0"}, ["it was built from other inputs"]),
        (BOTH, {**SIGNED, labels.IMAGE_SIGNING_CERT: "c0"}, ["it was signed with another certificate"]),
        (BOTH, {**SIGNED, labels.IMAGE_SIGN_HASH: "s0"}, ["it was signed from other inputs"]),
        (BUILD, BUILT, []),
        (BUILD, SIGNED, ["it is signed and the Module no longer signs"]),
        (SIGN, {**SIGNED, labels.IMAGE_BUILD_HASH: "someone else's"}, []),
    ],
    ids=[
        "as-asked", "labels-unknown", "not-kmms", "another-pass", "not-signed", "other-build",
        "other-certificate", "other-sign-inputs", "build-only", "sign-removed",
        "sign-only-ignores-build-labels",
    ],
)  # fmt: skip
def test_what_an_image_s_labels_say(
    target: kernels.Target, found: dict[str, str] | None, why: list[str]
) -> None:
    fact = dataclasses.replace(EXISTS, labels=found)
    assert images.outdated(target, fact, WANTED) == why
