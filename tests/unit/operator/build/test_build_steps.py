"""The per-kernel state machine (``steps.next_step``), as a table: facts and
observed pods in, one step out."""

from __future__ import annotations

from typing import Any

import pytest
import test_build_planner as cases

from kmm.api import kernels
from kmm.operator.build import existence, images, steps
from kmm.operator.loader import planner as loader_planner

EXISTS = existence.Fact(existence.State.EXISTS)
MISSING = existence.Fact(existence.State.MISSING)
REFUSED = existence.Fact(existence.State.AUTH_FAILED, "refused")
SILENT = existence.Fact(existence.State.ERROR, "no answer")
RUNNING: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
FAILED: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"phase": "Failed"}}


def _target(*, build: bool = True, sign: bool = True) -> kernels.Target:
    view = cases._view(cases._raw(build=build, sign=sign))
    return loader_planner.grouping(view).targets[cases.K1]


BOTH, BUILD, SIGN = _target(), _target(sign=False), _target(build=False)


@pytest.mark.parametrize(
    ("target", "facts", "sign_pod", "rebuild", "expected"),
    [
        (BOTH, images.Facts(EXISTS), None, False, steps.Step("exists", finish=steps.ROLES)),
        (BOTH, images.Facts(REFUSED), None, False, steps.Step("blocked", fact=REFUSED, image=cases.IMAGE1)),
        (BOTH, images.Facts(SILENT), None, False, steps.Step("blocked", fact=SILENT, image=cases.IMAGE1)),
        (BUILD, images.Facts(MISSING), None, False, steps.Step("run", "build")),
        (BOTH, images.Facts(MISSING), None, False, steps.Step("checking")),
        (BOTH, images.Facts(MISSING, MISSING), None, False, steps.Step("run", "build")),
        (BOTH, images.Facts(MISSING, EXISTS), None, False, steps.Step("run", "sign", finish=("build",))),
        (BOTH, images.Facts(MISSING, REFUSED), None, False, steps.Step("blocked", fact=REFUSED, image=images.intermediate_image(cases.IMAGE1))),
        (BOTH, images.Facts(MISSING), FAILED, False, steps.Step("run", "sign")),
        (BOTH, images.Facts(MISSING), RUNNING, True, steps.Step("run", "sign")),
        (BOTH, images.Facts(MISSING), FAILED, True, steps.Step("run", "build", finish=("sign",))),
        (BOTH, images.Facts(MISSING, EXISTS), None, True, steps.Step("run", "build", finish=("sign",))),
        (SIGN, images.Facts(MISSING, MISSING), None, False, steps.Step("awaiting", image=f"r.io/unsigned:{cases.K1}")),
        (SIGN, images.Facts(MISSING, EXISTS), None, False, steps.Step("run", "sign")),
        (SIGN, images.Facts(MISSING), FAILED, False, steps.Step("run", "sign")),
    ],
    ids=[
        "final-exists", "final-refused", "final-unanswered", "build-only",
        "unsigned-not-asked", "unsigned-missing-builds", "unsigned-there-signs",
        "unsigned-refused", "a-sign-pod-runs-to-its-end", "rebuild-waits-for-a-running-sign",
        "rebuild-replaces-an-ended-sign", "rebuild-ignores-a-stale-unsigned-image",
        "sign-only-awaits-its-image", "sign-only-signs", "sign-only-pod-runs-to-its-end",
    ],
)  # fmt: skip
def test_the_next_step(
    target: kernels.Target,
    facts: images.Facts,
    sign_pod: dict[str, Any] | None,
    rebuild: bool,
    expected: steps.Step,
) -> None:
    observed = {"build": None, "sign": sign_pod}
    assert steps.next_step(target, facts, observed, rebuild=rebuild) == expected
