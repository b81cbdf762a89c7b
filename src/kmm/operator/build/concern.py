"""Build and sign as one concern of the Module reconcile: the I/O around the
pure ``planner``.

Before the loader's planner runs, ``BuildConcern.plan`` gathers what the
planner needs for the kernels whose mapping builds or signs:

1. ``spec.imageRebuildTriggerGeneration`` moved past the status's (and not
   yet acted on by this process): every image of the Module is forgotten,
   so each is asked again and the missing ones built (KMM's "verify,
   rebuild if missing"). What survives a restart is in the images: an
   intermediate image of an earlier pass carries that pass's trigger in
   its labels, so it is built again rather than signed (``images``), and
   nothing of a pass is kept in memory;
2. a build or sign pod that succeeded since the last reconcile: the image it
   pushed is forgotten (``planner.pushed_by_succeeded``), once per pod
   (``_refreshed``: the planner notices the pod only once the new answer
   came, a reconcile or more later);
3. the verdicts of pull pods (``pulling``): where the registry check could
   not decide, a node's answer becomes the checker's fact, once per pod;
4. existence facts (``existence.Checker``; remembered, so a converged Module
   asks no registry anything); while the final image is missing or
   outdated, also of the image a sign pod would sign (the build's
   intermediate one, or ``unsignedImage`` without build, which someone
   else pushes: asked again every ``Settings.poll`` seconds while it is
   missing). The checker never makes the reconcile wait: a fact with no
   answer yet is pending (the kernel shows "Checking"), its check runs in
   the background, and the Module is requeued (``enqueue``) when the
   answer lands;
5. the ConfigMaps and Secrets the pods read (``inputs``), GET on demand
   (no informer on Secrets): for kernels whose final image is missing, and
   for one kmm made, to compare its labels with what the Module asks for
   (``images.outdated``). That comparison is remembered per kernel for the
   Module's generation and the fact it judged (``_compared``), so a
   converged Module reads nothing; it is made again when the Module's spec
   changes (``sign`` added, another Dockerfile ConfigMap ...) or the fact
   is established again (a restart, a succeeded pod, a moved trigger).
   A ConfigMap or Secret changed behind an existing image sends the
   Module no event (the operator may only GET Secrets) and rebuilds
   nothing until then: bump ``imageRebuildTriggerGeneration`` to have it
   compared at once. Watching them would need list and watch on every
   Secret of the cluster, and polling them costs reads per Module forever
   for images that work.
6. after the plan: the intermediate image a succeeded sign pod signed is
   deleted (``existence.Checker.remove``, in the background); a registry
   that refuses deletes is told once per image on the Module
   (``IntermediateImageKept``, a Normal Event), never as a failure.

``done`` records what the planner noticed (pods whose outcome was told);
``trigger_generation`` says which generation the status may claim done.
Per-Module memory is dropped by ``forget_module``.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kmm.api import kernels, labels
from kmm.operator import views
from kmm.operator.build import (
    desired,
    existence,
    images,
    inputs,
    planner,
    podstatus,
    pulling,
    settings,
    steps,
)

__all__ = ["REASON_INTERMEDIATE_KEPT", "BuildConcern"]

RawObject = dict[str, Any]

REASON_INTERMEDIATE_KEPT: Final = "IntermediateImageKept"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class _Compared:
    """A kernel's final image found to be what the Module asks for: at which
    generation of the Module, and which fact (when it was checked)."""

    generation: int | None
    checked_at: float


@dataclasses.dataclass
class BuildConcern:
    checker: existence.Checker
    reader: inputs.Reader
    settings: settings.Settings = dataclasses.field(default_factory=settings.Settings)
    now: Callable[[], datetime.datetime] = _now
    monotonic: Callable[[], float] = time.monotonic
    # Requeues a Module (by key) when a registry answer it waits for lands.
    enqueue: Callable[[str], None] | None = None
    _noticed: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    # Per Module, the succeeded pods whose pushed image was forgotten (by uid).
    _refreshed: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    _rebuilt: dict[str, int] = dataclasses.field(default_factory=dict)
    # Per Module, kernels whose existing final image was compared and found
    # as asked (``images.outdated`` empty).
    _compared: dict[str, dict[str, _Compared]] = dataclasses.field(default_factory=dict)
    # Per Module, the pull pods whose verdict was kept (by uid).
    _judged: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    # Per Module, intermediate images being deleted, and those a registry
    # refused to delete (told once; not tried again).
    _removing: dict[str, set[existence.Key]] = dataclasses.field(default_factory=dict)
    _kept: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    def forget_module(self, key: str) -> None:
        self._noticed.pop(key, None)
        self._refreshed.pop(key, None)
        self._rebuilt.pop(key, None)
        self._compared.pop(key, None)
        self._judged.pop(key, None)
        self._removing.pop(key, None)
        self._kept.pop(key, None)

    async def _secret(self, namespace: str, name: str) -> RawObject | None:
        return await self.reader.get("Secret", namespace, name)

    def _trigger(self, view: views.ModuleView, targets: Mapping[str, kernels.Target]) -> None:
        key = f"{view.namespace}/{view.name}"
        wanted = view.module.spec.image_rebuild_trigger_generation
        status = view.module.status
        done = status.image_rebuild_trigger_generation if status is not None else None
        if wanted is None or wanted == done or self._rebuilt.get(key) == wanted:
            return
        for target in targets.values():
            self.checker.forget(target.image)
            if target.build is not None and target.sign is not None:
                self.checker.forget(images.intermediate_image(target.image))
        self._rebuilt[key] = wanted

    def _judge(self, view: views.ModuleView, targets: Mapping[str, kernels.Target]) -> None:
        """Keep the verdict of each pull pod that gave one, once per pod."""
        key = f"{view.namespace}/{view.name}"
        found = view.pods.get(labels.PULL_ROLE, ())
        judged = self._judged.setdefault(key, set()) & {podstatus.uid(p) for p in found}
        self._judged[key] = judged
        if not found:
            return
        asked = {
            pulling.pod_name(view.name, each.image): each
            for target in targets.values()
            for each in images.keys(view.module, target)
        }
        for pod in found:
            each = asked.get(podstatus.name(pod))
            if each is None or podstatus.uid(pod) in judged or podstatus.deleting(pod):
                continue
            verdict = pulling.verdict(pod, each.image)
            if verdict is not None:
                self.checker.record(each, verdict)
                judged.add(podstatus.uid(pod))

    def _outdated(
        self,
        view: views.ModuleView,
        kernel: str,
        target: kernels.Target,
        fact: existence.Fact,
        found: inputs.Snapshot,
    ) -> list[str]:
        """Why the existing final image is not what the Module asks for
        (``images.outdated``), remembered when it is as asked."""
        wanted = desired.wanted(view.module, target, found, self.settings)
        why = images.outdated(target, fact, wanted) if wanted is not None else []
        if not why:
            compared = self._compared.setdefault(f"{view.namespace}/{view.name}", {})
            compared[kernel] = _Compared(view.module.metadata.generation, fact.checked_at)
        return why

    def _known_as_asked(self, view: views.ModuleView, kernel: str, fact: existence.Fact) -> bool:
        found = self._compared.get(f"{view.namespace}/{view.name}", {}).get(kernel)
        return found == _Compared(view.module.metadata.generation, fact.checked_at)

    async def plan(
        self, view: views.ModuleView, targets: Mapping[str, kernels.Target]
    ) -> planner.BuildPlan:
        key = f"{view.namespace}/{view.name}"
        wanted = planner.concerned(targets) if planner.module_builds(view.module) else {}
        if not wanted:
            self.forget_module(key)
            return planner.BuildPlan()
        self._trigger(view, wanted)
        noticed = self._noticed.get(key, set())
        succeeded = _succeeded(view)
        refreshed = self._refreshed.get(key, set()) & succeeded
        for image in planner.pushed_by_succeeded(view, wanted, noticed | refreshed):
            self.checker.forget(image)
        self._refreshed[key] = succeeded
        self._judge(view, wanted)
        waiter = existence.Waiter(self.enqueue, key) if self.enqueue is not None else None
        finals = {
            kernel: self.checker.fact(
                images.keys(view.module, target)[0], self._secret, waiter=waiter
            )
            for kernel, target in wanted.items()
        }
        # Inputs are read for a kernel whose final image is known missing
        # (only it may get a pod), or exists, made by kmm, and was not yet
        # compared for this generation and this fact.
        reading = {
            k: t
            for k, t in wanted.items()
            if finals[k].state is existence.State.MISSING
            or (
                finals[k].state is existence.State.EXISTS
                and images.made_by_kmm(finals[k].labels)
                and not self._known_as_asked(view, k, finals[k])
            )
        }
        read = await self._inputs(view, reading) if reading else inputs.Snapshot()
        outdated: dict[str, list[str]] = {}
        for kernel, target in reading.items():
            if finals[kernel].state is existence.State.EXISTS:
                why = self._outdated(view, kernel, target, finals[kernel], read)
                if why:
                    outdated[kernel] = why
        facts: dict[str, images.Facts] = {}
        retry: list[float] = []
        for kernel, target in wanted.items():
            final, unsigned = finals[kernel], None
            if images.unsigned_wanted(target, final, outdated=kernel in outdated):
                # Someone else's unsigned image is pushed whenever: a
                # MISSING answer goes stale, and is asked again every poll.
                foreign = images.foreign_unsigned(target) is not None
                unsigned = self.checker.fact(
                    images.keys(view.module, target)[1],
                    self._secret,
                    waiter=waiter,
                    recheck_missing=self.settings.poll if foreign else None,
                )
            facts[kernel] = images.Facts(final, unsigned)
            retry.extend(f.retry_at for f in (final, unsigned) if f is not None and f.retry_at)
        found = planner.plan(
            view, wanted, facts, read,
            noticed=noticed, settings=self.settings, now=self.now(),
            outdated=outdated, judged=frozenset(self._judged.get(key, ())),
        )  # fmt: skip
        self._clean_up(view, wanted, found, waiter)
        for at in retry:
            found.requeue(at - self.monotonic())
        return found

    def _clean_up(
        self,
        view: views.ModuleView,
        targets: Mapping[str, kernels.Target],
        found: planner.BuildPlan,
        waiter: existence.Waiter | None,
    ) -> None:
        """Start the deletes ``found`` asks for; tell how earlier ones ended
        (a refusal once per image, as a Normal Event: nothing failed)."""
        key = f"{view.namespace}/{view.name}"
        removing = self._removing.setdefault(key, set())
        kept = self._kept.setdefault(key, set())
        for each in sorted(removing, key=lambda k: k.image):
            done = self.checker.removal(each)
            if done is None:
                continue
            removing.discard(each)
            if done.outcome != "deleted" and each.image not in kept:
                kept.add(each.image)
                found.events.append(
                    planner.Event(
                        "Normal",
                        REASON_INTERMEDIATE_KEPT,
                        f"intermediate image {each.image} was signed and is not needed any "
                        f"more, but it was not deleted ({done.outcome}: {done.message}); "
                        "it is left in the registry",
                    )
                )
        for cleanup in found.cleanup:
            target = targets.get(cleanup.kernel)
            if target is None or cleanup.image in kept:
                continue
            unsigned = images.keys(view.module, target)[1]
            if self.checker.remove(unsigned, cleanup.digest, self._secret, waiter=waiter):
                removing.add(unsigned)

    async def _inputs(
        self, view: views.ModuleView, targets: Mapping[str, kernels.Target]
    ) -> inputs.Snapshot:
        wanted = {w for target in targets.values() for w in inputs.wanted(view.module, target)}
        return await inputs.read(self.reader, view.namespace, sorted(wanted))

    def done(self, view: views.ModuleView, plan: planner.BuildPlan) -> None:
        """Remember what ``plan`` told (its events were sent)."""
        key = f"{view.namespace}/{view.name}"
        if plan.concerned:
            self._noticed[key] = set(plan.noticed)

    def trigger_generation(self, view: views.ModuleView, plan: planner.BuildPlan) -> int | None:
        """The status's ``imageRebuildTriggerGeneration``: the spec's once every
        image of the Module exists, the status's until then."""
        wanted = view.module.spec.image_rebuild_trigger_generation
        status = view.module.status
        done = status.image_rebuild_trigger_generation if status is not None else None
        if wanted is not None and plan.all_exist() and not plan.create:
            return wanted
        return done


def _succeeded(view: views.ModuleView) -> set[str]:
    """The uids (names where a test gave none) of the Module's succeeded
    build and sign pods the cache shows."""
    return {
        podstatus.uid(pod)
        for role in steps.ROLES
        for pod in view.pods.get(role, ())
        if podstatus.succeeded(pod)
    }
