"""Where one kernel's image stands, and what it does next (pure): the build
planner's state machine, as one decision function over what is known.

``next_step`` reads the registry's facts (``images.Facts``), which of the
kernel's build and sign pods the cache shows, and whether a rebuild pass
made its unsigned image stale, and answers one ``Step``:

==========  ==============================================================
``exists``  the final image exists: nothing to make; pods that ended go
``blocked`` a fact that is no answer (refused credentials, no answer)
            stops the kernel: ``fact`` and the ``image`` it is about
``checking`` the unsigned image's existence was not asked yet
``awaiting`` sign without build: the foreign unsigned ``image`` is missing
``run``     the pod of ``role`` must succeed (made, awaited, shown when it
            failed, replaced when its inputs changed); ``finish``: ended
            pods of other roles no longer needed
==========  ==============================================================

In order, for a final image that is missing: with build and sign, a
rebuild pass builds first (a sign pod that ended signed the stale image);
a sign pod the cache shows is run to its end (a failed sign is retried as a
sign, never by a rebuild); then the unsigned image decides: there, it is
signed; missing, it is built. Sign without build signs once someone pushed
the unsigned image. Build without sign builds. The planner (``planner``)
carries a step out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal

from kmm.api import kernels
from kmm.operator.build import existence, images, pods, podstatus

__all__ = ["ROLES", "Step", "next_step"]

ROLES: Final[tuple[pods.PodRole, pods.PodRole]] = ("build", "sign")

Kind = Literal["exists", "blocked", "checking", "awaiting", "run"]


@dataclasses.dataclass(frozen=True)
class Step:
    kind: Kind
    role: pods.PodRole | None = None  # run
    fact: existence.Fact | None = None  # blocked
    image: str | None = None  # blocked, awaiting
    finish: tuple[pods.PodRole, ...] = ()


def _answerless(fact: existence.Fact, image: str) -> Step | None:
    if fact.state in (existence.State.AUTH_FAILED, existence.State.ERROR):
        return Step("blocked", fact=fact, image=image)
    return None


def next_step(
    target: kernels.Target,
    facts: images.Facts,
    observed: Mapping[pods.PodRole, Mapping[str, Any] | None],
    *,
    rebuild: bool = False,
) -> Step:
    """The kernel's next step; ``observed``: its build and sign pods (None
    when the cache shows none); ``rebuild``: its unsigned image, if any, is
    stale (an ``imageRebuildTriggerGeneration`` pass has not built yet)."""
    final = facts.final
    if final.state is existence.State.EXISTS:
        return Step("exists", finish=ROLES)
    if (stop := _answerless(final, target.image)) is not None:
        return stop
    build, sign = target.build, target.sign
    if sign is None:
        return Step("run", "build")
    signing = observed.get("sign")
    if build is not None and rebuild and (signing is None or podstatus.ended(signing)):
        return Step("run", "build", finish=("sign",))
    if signing is not None:
        return Step("run", "sign")
    unsigned = facts.unsigned
    if unsigned is None:
        return Step("checking")
    image = images.unsigned_image(target)
    if (stop := _answerless(unsigned, image)) is not None:
        return stop
    if unsigned.state is existence.State.EXISTS:
        return Step("run", "sign", finish=("build",) if build is not None else ())
    if build is None:
        return Step("awaiting", image=image)
    return Step("run", "build")
