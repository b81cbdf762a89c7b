"""Where one kernel's image stands, and what it does next (pure): the build
planner's state machine, as one decision function over what is known.

``next_step`` reads the registry's facts (``images.Facts``), which of the
kernel's build and sign pods the cache shows, why its final image is not
what the Module asks for (``outdated``, from ``images.outdated``) and what
it asks for (``images.Wanted``), and answers one ``Step``:

==========  ==============================================================
``exists``  the final image exists and is what the Module asks for (or
            kmm did not make it: taken as it is): nothing to make; pods
            that ended go
``asking``  the operator cannot tell whether ``image`` exists (``fact`` is
            undecided: no answer from here, credentials it lacks): a node
            is asked with a pull pod (``pulling``)
``blocked`` a fact that is no answer (refused credentials, no answer yet)
            stops the kernel: ``fact`` and the ``image`` it is about
``checking`` the unsigned image's existence was not asked yet
``awaiting`` sign without build: the foreign unsigned ``image`` is missing
``run``     the pod of ``role`` must succeed (made, awaited, shown when it
            failed, replaced when its inputs changed); ``finish``: ended
            pods of other roles no longer needed
==========  ==============================================================

In order, for a final image that is missing or outdated: build only, it is
built. Sign only, once someone pushed the unsigned image, it is signed. Build
and sign: a sign pod still running runs to its end (its planner replaces it
when its inputs changed); one that found its unsigned image stale
(``scripts.STALE_EXIT``) gives way to a build. Then the unsigned image
decides: there and made by this build of the current inputs
(``images.signable``), it is signed (a failed sign is retried as a sign,
never by a rebuild); there but made from other inputs, or by an earlier
rebuild pass, or missing, it is built. Where its labels cannot be read (a
node's verdict) it is signed, and the sign pod checks them. The planner
(``planner``) carries a step out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import kernels
from kmm.operator.build import existence, images, podparts, podstatus, scripts

__all__ = ["ROLES", "Step", "next_step"]

ROLES: Final[tuple[podparts.PodRole, podparts.PodRole]] = ("build", "sign")

Kind = Literal["exists", "asking", "blocked", "checking", "awaiting", "run"]


@dataclasses.dataclass(frozen=True)
class Step:
    kind: Kind
    role: podparts.PodRole | None = None  # run
    fact: existence.Fact | None = None  # asking, blocked
    image: str | None = None  # asking, blocked, awaiting
    finish: tuple[podparts.PodRole, ...] = ()


def _answerless(fact: existence.Fact, image: str) -> Step | None:
    if fact.undecided and not fact.pending:
        return Step("asking", fact=fact, image=image)
    if fact.state in (existence.State.AUTH_FAILED, existence.State.ERROR):
        return Step("blocked", fact=fact, image=image)
    return None


def _stale_sign(pod: Mapping[str, Any] | None) -> bool:
    """A sign pod that refused its unsigned image as not the expected build."""
    return (
        pod is not None
        and podstatus.phase(pod) == "Failed"
        and podstatus.exit_code(pod) == scripts.STALE_EXIT
    )


def next_step(
    target: kernels.Target,
    facts: images.Facts,
    observed: Mapping[podparts.PodRole, Mapping[str, Any] | None],
    *,
    outdated: Sequence[str] = (),
    wanted: images.Wanted | None = None,
) -> Step:
    """The kernel's next step; ``observed``: its build and sign pods (None
    when the cache shows none); ``outdated``: why its existing final image
    is not what the Module asks for (empty: it is); ``wanted``: what the
    Module asks for (None: its inputs were not read, or are missing)."""
    final = facts.final
    if final.state is existence.State.EXISTS and not outdated:
        return Step("exists", finish=ROLES)
    if (
        final.state is not existence.State.EXISTS
        and (stop := _answerless(final, target.image)) is not None
    ):
        return stop
    build, sign = target.build, target.sign
    if sign is None:
        return Step("run", "build")
    signing = observed.get("sign")
    if build is None:
        return _sign_only(target, facts, signing)
    if signing is not None and not podstatus.ended(signing):
        return Step("run", "sign")
    if _stale_sign(signing):
        return Step("run", "build", finish=("sign",))
    unsigned = facts.unsigned
    image = images.unsigned_image(target)
    stop = _answerless(unsigned, image) if unsigned is not None else Step("checking")
    if stop is not None:
        if signing is not None and podstatus.phase(signing) == "Failed":
            return Step("run", "sign")  # shown failed until its inputs change
        return stop
    assert unsigned is not None
    if unsigned.state is existence.State.EXISTS and (
        wanted is None or images.signable(target, unsigned, wanted) is not False
    ):
        return Step("run", "sign", finish=("build",))
    return Step("run", "build", finish=("sign",))


def _sign_only(
    target: kernels.Target, facts: images.Facts, signing: Mapping[str, Any] | None
) -> Step:
    if signing is not None:
        return Step("run", "sign")
    unsigned = facts.unsigned
    if unsigned is None:
        return Step("checking")
    image = images.unsigned_image(target)
    if (stop := _answerless(unsigned, image)) is not None:
        return stop
    if unsigned.state is existence.State.EXISTS:
        return Step("run", "sign")
    return Step("awaiting", image=image)
