"""The build-and-sign planner for one Module: which pods to create or delete,
which kernels wait for their image (pure).

Only kernel targets whose merged mapping has ``build`` or ``sign`` concern
it; a Module without either gets an empty plan and its loader DaemonSets at
once. For each such kernel, from the facts the reconciler gathered
(``images.Facts``), the inputs it read (``inputs.Snapshot``) and the build
and sign pods the cache holds, ``steps.next_step`` says where the kernel
stands and this module carries the step out:

- final image ``EXISTS``: nothing to do; the kernel's loader may run;
- ``AUTH_FAILED``: an authentication error naming the Secret, never a
  build; ``ERROR``: checked again after the back-off (``Checking``);
- undecided (the operator cannot tell from where it stands): a node is
  asked with a pull pod (``pulling``), made here, judged by the concern,
  deleted here once its verdict is the fact;
- ``MISSING``, or ``EXISTS`` but not what the Module asks for
  (``outdated``: its labels say it was built from other inputs, is not
  signed ...; ``images``): the kernel is *gated* (its loader DaemonSet is
  not created until the image exists; one that exists stays,
  ``loader.planner``), and an outdated image is told once
  (``ImageOutdated``). Build only: a build pod pushes the final image.
  Sign only: once the registry has ``unsignedImage`` (asked every
  ``Settings.poll`` seconds until then), a sign pod signs it into the final
  image. Build and sign: the build pushes ``images.intermediate_image(final)``
  and, once that exists and its labels say this build of the current inputs
  made it (``images.signable``), a sign pod pushes the signed result under
  the final name, so only a signed image ever carries it; a failed sign is
  retried as a sign, never by a rebuild. An intermediate image of other
  inputs or of an earlier rebuild pass is built again, never signed
  (``steps``). Once a sign pod succeeded, the intermediate image it signed
  (its ``unsignedDigest``) is to be deleted (``cleanup``; the concern
  deletes it).

An existing final image kmm built (labelled, with a digest) is *pinned*:
``digests`` gives its manifest digest per kernel, and the loader runs
``image@digest`` (``loader.builders``), so a node runs the image the Module
asks for, never a tag it cached.

A pod's ``last-hash`` (``hashing``) digests the rendered pod and its inputs
(``desired``). A pod that has not succeeded and whose hash is no longer the
one its kernel needs is replaced, whatever its phase, as KMM's
``buildsign`` manager does: deleted (``BuildReplaced``/``SignReplaced``
saying what changed), made again once the cache shows it gone. A pending
or running pod is looked at every ``Settings.poll`` seconds (a fixed
ConfigMap or Secret sends the Module no event); one stuck before it could
start (``podstatus.waiting``: ImagePullBackOff, Unschedulable ...) is shown
with that reason as the Degraded reason, once as a Warning Event. A failed
pod is kept (its termination message, the log tail under
``FallbackToLogsOnError``, is the Degraded message), its kernel requeued
every poll, until its inputs change or someone deletes it. A succeeded pod
is deleted ``Settings.retention`` seconds after it finished; a sign pod's
summary (``{"signed": [...], "unmatched": [...]}``) first gives a Warning
Event per pattern that matched nothing.

Events (``BuildCreated`` ... ``SignFailed``) are given once per pod:
``noticed`` holds the uids (and authentication messages) already told,
kept by the reconciler between reconciles and pruned here to what the
cache still shows.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import kernels, labels, modules
from kmm.operator import status, views
from kmm.operator.build import (
    desired,
    existence,
    hashing,
    images,
    inputs,
    podnames,
    podparts,
    podstatus,
    pulling,
    settings,
    steps,
)

__all__ = [
    "BuildPlan",
    "Cleanup",
    "Creation",
    "Event",
    "concerned",
    "module_builds",
    "plan",
    "pushed_by_succeeded",
]

RawObject = dict[str, Any]

REASON_AUTHENTICATION_FAILED: Final = "AuthenticationFailed"
REASON_BUILD_FAILED: Final = "BuildFailed"
REASON_SIGN_FAILED: Final = "SignFailed"
REASON_IMAGE_OUTDATED: Final = "ImageOutdated"
# ``noticed`` keys kept only while a plan tells them again (not pod uids).
_TOLD_WHILE: Final = ("auth:", "inputs:", "outdated:")


@dataclasses.dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Creation:
    """A pod to create and the Event that tells it was."""

    pod: RawObject
    event: Event


@dataclasses.dataclass(frozen=True)
class Cleanup:
    """An intermediate image a sign pod signed: ``image`` (the tag) and the
    manifest ``digest`` it signed, to delete."""

    kernel: str
    image: str
    digest: str


@dataclasses.dataclass
class BuildPlan:
    create: list[Creation] = dataclasses.field(default_factory=list)
    delete: list[RawObject] = dataclasses.field(default_factory=list)  # observed pods
    gated: set[str] = dataclasses.field(default_factory=set)  # kernels
    # Kernels whose final image kmm built and exists as asked: its digest.
    digests: dict[str, str] = dataclasses.field(default_factory=dict)
    cleanup: list[Cleanup] = dataclasses.field(default_factory=list)
    asking: set[str] = dataclasses.field(default_factory=set)  # pull pods wanted
    images: list[modules.ImageStatus] = dataclasses.field(default_factory=list)
    problems: list[status.Problem] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    noticed: set[str] = dataclasses.field(default_factory=set)
    requeue_after: float | None = None

    @property
    def concerned(self) -> bool:
        return bool(self.images)

    def all_exist(self) -> bool:
        return all(image.state == "Exists" for image in self.images)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


def module_builds(module: modules.Module) -> bool:
    """Whether any level of ``module`` has ``build`` or ``sign`` (cheap: no
    node is looked at, so a Module that builds nothing costs nothing here)."""
    loader = module.spec.module_loader
    if loader is None:
        return False
    container = loader.container
    return (
        container.build is not None
        or container.sign is not None
        or any(m.build is not None or m.sign is not None for m in container.kernel_mappings)
    )


def concerned(targets: Mapping[str, kernels.Target]) -> dict[str, kernels.Target]:
    """The kernels whose image is built or signed when missing."""
    return {k: t for k, t in sorted(targets.items()) if t.build is not None or t.sign is not None}


def _pod_named(view: views.ModuleView, role: podparts.PodRole, name: str) -> RawObject | None:
    return next((p for p in view.pods.get(role, ()) if podstatus.name(p) == name), None)


def pushed_by_succeeded(
    view: views.ModuleView, targets: Mapping[str, kernels.Target], noticed: set[str]
) -> set[str]:
    """Images that a build or sign pod not yet ``noticed`` pushed
    successfully: the reconciler forgets what it knew of them first."""
    found: set[str] = set()
    for kernel, target in concerned(targets).items():
        for role in steps.ROLES:
            pod = _pod_named(view, role, podnames.pod_name(view.name, role, kernel))
            if pod is None or not podstatus.succeeded(pod) or podstatus.uid(pod) in noticed:
                continue
            found.add(images.pushed_by(target, role))
    return found


@dataclasses.dataclass
class _Kernel:
    """The planning of one kernel: its target and what it found."""

    view: views.ModuleView
    kernel: str
    target: kernels.Target
    facts: images.Facts
    found: inputs.Snapshot
    config: settings.Settings
    noticed: set[str]
    now: datetime.datetime
    out: BuildPlan
    # Why the existing final image is not what the Module asks for ([]: it is).
    outdated: list[str] = dataclasses.field(default_factory=list)
    # Pull pods whose verdict the concern already kept (by uid).
    judged: frozenset[str] = frozenset()

    def image(
        self, state: modules.ImageState, *, pod: str | None = None, message: str | None = None
    ) -> None:
        self.out.images.append(
            modules.ImageStatus(
                kernel=self.kernel, image=self.target.image, state=state, pod=pod, message=message
            )
        )

    def tell(self, key: str, event: Event) -> None:
        """``event``, unless told already for ``key``; remembered either way."""
        if key not in self.noticed:
            self.out.events.append(event)
        self.out.noticed.add(key)

    def observed(self, role: podparts.PodRole) -> RawObject | None:
        return _pod_named(self.view, role, podnames.pod_name(self.view.name, role, self.kernel))

    def finish_succeeded(self, role: podparts.PodRole, pod: RawObject) -> None:
        """Events once, then the delete once ``retention`` has passed."""
        name, uid = podstatus.name(pod), podstatus.uid(pod)
        reason = "BuildSucceeded" if role == "build" else "SignSucceeded"
        what = f"{role} pod {name} for kernel {self.kernel} succeeded"
        if role == "sign":
            summary = podstatus.summary(pod)
            source = summary.get("unsignedDigest")
            if self.target.build is not None and isinstance(source, str) and source:
                key = f"{uid}:cleanup"
                if key not in self.noticed:
                    unsigned = images.intermediate_image(self.target.image)
                    self.out.cleanup.append(Cleanup(self.kernel, unsigned, source))
                self.out.noticed.add(key)
            signed = summary.get("signed") or ()
            what += f": {len(signed)} file(s) signed into {self.target.image}"
            for pattern in summary.get("unmatched") or ():
                self.tell(
                    f"{uid}:unmatched:{pattern}",
                    Event(
                        "Warning",
                        "FilesToSignUnmatched",
                        f"filesToSign pattern {pattern!r} matched no file for kernel {self.kernel}",
                    ),
                )
        self.tell(uid, Event("Normal", reason, what))
        ended = podstatus.finished(pod)
        left = 0.0 if ended is None else self.config.retention - (self.now - ended).total_seconds()
        if left <= 0:
            self.out.delete.append(pod)
        else:
            self.out.requeue(left)

    def run_pod(self, role: podparts.PodRole) -> None:
        """The kernel needs the pod of ``role`` to succeed: make it, wait for
        it, replace it when its inputs changed, or show its failure."""
        name = podnames.pod_name(self.view.name, role, self.kernel)
        observed = self.observed(role)
        busy: modules.ImageState = "Building" if role == "build" else "Signing"
        failed_state: modules.ImageState = "BuildFailed" if role == "build" else "SignFailed"
        failed_reason = REASON_BUILD_FAILED if role == "build" else REASON_SIGN_FAILED
        if observed is not None and podstatus.deleting(observed):
            self.image(busy, pod=name, message="waiting for the old pod to go")
            return
        phase = podstatus.phase(observed) if observed is not None else ""
        if observed is not None and podstatus.succeeded(observed):
            # Its image is checked again before this plan (``pushed_by_succeeded``).
            self.finish_succeeded(role, observed)
            self.image(busy, pod=name)
            return
        wanted, missing = desired.module_pod(
            self.view.module, self.target, role, self.found, self.config
        )
        if (
            observed is not None
            and wanted is not None
            and hashing.of_pod(observed) != hashing.of_pod(wanted)
        ):
            self.replace(role, observed, wanted)
            self.image(busy, pod=name, message="replacing the pod: its inputs changed")
            return
        if observed is not None and phase != "Failed":
            self.in_progress(role, observed, busy)
            return
        if wanted is None:
            message = f"{role} for kernel {self.kernel}: " + "; ".join(missing)
            self.out.problems.append(status.Problem(failed_reason, message))
            self.tell(f"inputs:{message}", Event("Warning", failed_reason, message))
            self.image(failed_state, pod=name if observed is not None else None, message=message)
            self.out.requeue(self.config.poll)
            return
        if observed is not None:  # failed, from the inputs it would be made from now
            tail = podstatus.tail(observed)
            message = f"{role} pod {name} for kernel {self.kernel} failed: {tail}"
            self.out.problems.append(status.Problem(failed_reason, message))
            self.tell(podstatus.uid(observed), Event("Warning", failed_reason, message))
            self.image(failed_state, pod=name, message=tail)
            self.out.requeue(self.config.poll)
            return
        reason = "BuildCreated" if role == "build" else "SignCreated"
        self.out.create.append(
            Creation(
                wanted,
                Event("Normal", reason, f"created {role} pod {name} for kernel {self.kernel}"),
            )
        )
        self.image(busy, pod=name)

    def replace(self, role: podparts.PodRole, observed: RawObject, wanted: RawObject) -> None:
        """Delete ``observed``, made from inputs that changed, whatever its
        phase (as KMM does): a pod still running would push an image of the
        old inputs (a build-only pod, ``sign`` added since, the unsigned
        image under the final name), and one stuck before it started would
        stay stuck. Its successor (same name) is made once it is gone: the
        writer gives a pod that did not end a grace period, so its
        containers have stopped by then."""
        self.out.delete.append(observed)
        name = podstatus.name(observed)
        changed = ", ".join(hashing.changes(observed, wanted))
        reason = "BuildReplaced" if role == "build" else "SignReplaced"
        what = podstatus.phase(observed).lower() or "pending"
        message = f"replacing {what} {role} pod {name} for kernel {self.kernel}: {changed} changed"
        self.tell(f"{podstatus.uid(observed)}:replaced", Event("Normal", reason, message))

    def in_progress(
        self, role: podparts.PodRole, observed: RawObject, busy: modules.ImageState
    ) -> None:
        """A pod on its way, or stuck before it could start (shown, with the
        kubelet's or the scheduler's reason, until it starts or is replaced).
        Looked at again every poll: a fixed ConfigMap or Secret sends the
        Module no event, and a pod stuck waits for one."""
        name = podstatus.name(observed)
        self.out.requeue(self.config.poll)
        held = podstatus.waiting(observed)
        if held is None:
            self.image(busy, pod=name)
            return
        message = f"{role} pod {name} for kernel {self.kernel} cannot start: {held.reason}: {held.message}"
        self.out.problems.append(status.Problem(held.reason, message))
        key = f"{podstatus.uid(observed)}:waiting:{held.reason}"
        self.tell(key, Event("Warning", held.reason, message))
        self.image(busy, pod=name, message=f"{held.reason}: {held.message}")

    def blocked(self, fact: existence.Fact, image: str) -> None:
        """Show a fact that stops the kernel (authentication, no answer)."""
        if fact.state is existence.State.AUTH_FAILED:
            message = fact.message or f"{image}: the registry refused the credentials"
            self.out.problems.append(status.Problem(REASON_AUTHENTICATION_FAILED, message))
            self.tell(f"auth:{image}:{message}", Event("Warning", REASON_AUTHENTICATION_FAILED, message))  # fmt: skip
            self.image("AuthenticationFailed", message=message)
            self.out.requeue(self.config.poll)
        else:
            self.image("Checking", message=fact.message)

    def plan(self) -> None:
        observed = {role: self.observed(role) for role in steps.ROLES}
        final = self.facts.final
        made_of = None
        if final.state is existence.State.MISSING or self.outdated:
            made_of = desired.wanted(self.view.module, self.target, self.found, self.config)
        step = steps.next_step(
            self.target, self.facts, observed, outdated=self.outdated, wanted=made_of
        )
        if step.kind != "exists":
            self.out.gated.add(self.kernel)
        for role in step.finish:
            self.finish_stale(role)
        if self.outdated and step.kind != "exists":
            self.tell_outdated()
        if step.kind == "exists":
            if images.made_by_kmm(final.labels) and final.digest:
                self.out.digests[self.kernel] = final.digest
            self.image("Exists")
        elif step.kind == "asking":
            assert step.image is not None
            assert step.fact is not None
            self.ask_node(step.image, step.fact)
        elif step.kind == "blocked":
            assert step.fact is not None
            self.blocked(step.fact, step.image or "")
        elif step.kind == "checking":
            self.image("Checking")
        elif step.kind == "awaiting":
            self.image(
                "Missing",
                message=f"unsigned image {step.image} does not exist yet; "
                f"asked again every {self.config.poll:g} s",
            )
            self.out.requeue(self.config.poll)
        else:
            assert step.role is not None
            self.run_pod(step.role)

    def tell_outdated(self) -> None:
        """Once per image (its digest): why it is made again."""
        why = "; ".join(self.outdated)
        message = (
            f"image {self.target.image} for kernel {self.kernel} is not what the Module asks "
            f"for ({why}): it is built again"
            + (" and signed" if self.target.sign is not None else "")
        )
        key = f"outdated:{self.kernel}:{self.facts.final.digest}"
        self.tell(key, Event("Normal", REASON_IMAGE_OUTDATED, message))

    def ask_node(self, image: str, fact: existence.Fact) -> None:
        """A pull pod asks a node whether ``image`` exists (``pulling.ask``)."""
        name = pulling.pod_name(self.view.name, image)
        self.out.asking.add(name)
        found = pulling.ask(
            self.view, kernel=self.kernel, image=image, fact=fact, judged=self.judged
        )
        if found.delete is not None:
            self.out.delete.append(found.delete)
        if found.create is not None:
            what = f"asking node {found.node} whether {image} exists"
            self.out.create.append(Creation(found.create, Event("Normal", "PullPodCreated", what)))
        if found.later:
            self.out.requeue(self.config.poll)
        self.image("Checking", pod=found.pod, message=found.message)

    def finish_stale(self, role: podparts.PodRole) -> None:
        """A terminated pod of ``role`` no longer needed for this kernel."""
        pod = self.observed(role)
        if pod is None or podstatus.deleting(pod):
            return
        if podstatus.succeeded(pod):
            self.finish_succeeded(role, pod)
        elif podstatus.phase(pod) == "Failed":
            self.out.delete.append(pod)


def plan(
    view: views.ModuleView,
    targets: Mapping[str, kernels.Target],
    facts: Mapping[str, images.Facts],
    found: inputs.Snapshot,
    *,
    noticed: set[str],
    settings: settings.Settings,
    now: datetime.datetime,
    outdated: Mapping[str, Sequence[str]] | None = None,
    judged: frozenset[str] = frozenset(),
) -> BuildPlan:
    """The plan for the concerned kernels of ``targets`` (``facts`` given
    for each of them). Pods of kernels no longer targeted are deleted once
    they ended; pull pods no kernel asks with any more, at once.
    ``outdated``: per kernel whose final image exists, why it is not what
    the Module asks for (``images.outdated``; absent: it is); ``judged``:
    pull pods whose verdict the concern kept."""
    out = BuildPlan()
    wanted = concerned(targets)
    names: set[str] = set()
    for kernel, target in wanted.items():
        names.update(podnames.pod_name(view.name, role, kernel) for role in steps.ROLES)
        why = list((outdated or {}).get(kernel, ()))
        one = _Kernel(view, kernel, target, facts[kernel], found, settings, noticed, now, out, why, judged)  # fmt: skip
        one.plan()
    for pod in view.pods.get(labels.PULL_ROLE, ()):
        if podstatus.name(pod) not in out.asking and not podstatus.deleting(pod):
            out.delete.append(pod)
    for role in steps.ROLES:
        for pod in view.pods.get(role, ()):
            if podstatus.name(pod) in names or podstatus.deleting(pod):
                continue
            if podstatus.ended(pod):
                out.delete.append(pod)
    # A pod stays noticed while the cache shows it; an authentication
    # failure or a missing input while it is still the one shown.
    shown = {podstatus.uid(p) for role in steps.ROLES for p in view.pods.get(role, ())}
    out.noticed = {
        key
        for key in noticed | out.noticed
        if (key in out.noticed if key.startswith(_TOLD_WHILE) else key.split(":", 1)[0] in shown)
    }
    out.delete = _unique(out.delete)
    return out


def _unique(found: Sequence[RawObject]) -> list[RawObject]:
    seen: set[str] = set()
    kept: list[RawObject] = []
    for pod in found:
        name = podstatus.name(pod)
        if name not in seen:
            seen.add(name)
            kept.append(pod)
    return kept
