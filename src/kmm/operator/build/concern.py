"""Build and sign as one concern of the Module reconcile: the I/O around the
pure ``planner``.

Before the loader's planner runs, ``BuildConcern.plan`` gathers what the
planner needs for the kernels whose mapping builds or signs:

1. ``spec.imageRebuildTriggerGeneration`` moved past the status's (and not
   yet acted on by this process): every image of the Module is forgotten,
   so each is asked again and the missing ones built once. Until a build
   of the pass succeeded for a kernel that builds and signs, the
   intermediate image an earlier build left is stale (``_rebuilding``):
   the planner builds again rather than sign it. The pass is this
   process's memory: after a restart, a build running or succeeded counts,
   and a kernel whose build was already gone is built once more;
2. a build or sign pod that succeeded since the last reconcile: the image it
   pushed is forgotten (``planner.pushed_by_succeeded``), once per pod
   (``_refreshed``: the planner notices the pod only once the new answer
   came, a reconcile or more later);
3. existence facts (``existence.Checker``; remembered, so a converged Module
   asks no registry anything); while the final image is missing, also of the
   image a sign pod would sign (the build's intermediate one, or
   ``unsignedImage`` without build, which someone else pushes: asked again
   every ``Settings.poll`` seconds while it is missing). The checker never
   makes the reconcile wait: a fact with no answer yet is pending (the
   kernel shows "Checking"), its check runs in the background, and the
   Module is requeued (``enqueue``) when the answer lands;
4. the ConfigMaps and Secrets the pods read (``inputs``), GET on demand and
   only for kernels whose image is known to be missing (no informer on
   Secrets).

``done`` records what the planner noticed (pods whose outcome was told);
``trigger_generation`` says which generation the status may claim done.
Per-Module memory is dropped by ``forget_module``.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from kmm.api import kernels
from kmm.operator import views
from kmm.operator.build import existence, images, inputs, planner, pods, podstatus, settings, steps

__all__ = ["BuildConcern"]

RawObject = dict[str, Any]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


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
    # Per Module in a trigger pass: (its generation, kernel -> whether the
    # pass's build succeeded: False while it runs).
    _passes: dict[str, tuple[int, dict[str, bool]]] = dataclasses.field(default_factory=dict)

    def forget_module(self, key: str) -> None:
        self._noticed.pop(key, None)
        self._refreshed.pop(key, None)
        self._rebuilt.pop(key, None)
        self._passes.pop(key, None)

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

    def _rebuilding(
        self, view: views.ModuleView, targets: Mapping[str, kernels.Target]
    ) -> frozenset[str]:
        """The kernels that build and sign whose intermediate image is stale:
        a trigger pass is pending and no build of it has succeeded yet."""
        key = f"{view.namespace}/{view.name}"
        wanted = view.module.spec.image_rebuild_trigger_generation
        status = view.module.status
        done = status.image_rebuild_trigger_generation if status is not None else None
        if wanted is None or wanted == done:
            self._passes.pop(key, None)
            return frozenset()
        generation, built = self._passes.get(key, (wanted, {}))
        if generation != wanted:
            built = {}  # bumped again: a new pass
        both = [k for k, t in targets.items() if t.build is not None and t.sign is not None]
        for kernel in both:
            phase = planner.build_pod_phase(view, kernel)
            if phase == "Succeeded" and built.get(kernel) is False:
                built[kernel] = True
            elif phase is not None and phase not in ("Succeeded", "Failed"):
                built.setdefault(kernel, False)  # running: it counts once it succeeds
        self._passes[key] = (wanted, built)
        return frozenset(k for k in both if built.get(k) is not True)

    def _building(
        self, view: views.ModuleView, rebuild: frozenset[str], plan: planner.BuildPlan
    ) -> None:
        """A build pod created for a kernel of the pass is the pass's build."""
        found = self._passes.get(f"{view.namespace}/{view.name}")
        if found is None:
            return
        created = {c.pod["metadata"]["name"] for c in plan.create}
        for kernel in rebuild:
            if pods.pod_name(view.name, "build", kernel) in created:
                found[1][kernel] = False

    async def plan(
        self, view: views.ModuleView, targets: Mapping[str, kernels.Target]
    ) -> planner.BuildPlan:
        key = f"{view.namespace}/{view.name}"
        wanted = planner.concerned(targets) if planner.module_builds(view.module) else {}
        if not wanted:
            self.forget_module(key)
            return planner.BuildPlan()
        self._trigger(view, wanted)
        rebuild = self._rebuilding(view, wanted)
        noticed = self._noticed.get(key, set())
        succeeded = _succeeded(view)
        refreshed = self._refreshed.get(key, set()) & succeeded
        for image in planner.pushed_by_succeeded(view, wanted, noticed | refreshed):
            self.checker.forget(image)
        self._refreshed[key] = succeeded
        facts: dict[str, images.Facts] = {}
        retry: list[float] = []
        waiter = existence.Waiter(self.enqueue, key) if self.enqueue is not None else None
        for kernel, target in wanted.items():
            final_key, unsigned_key = images.keys(view.module, target)
            final = self.checker.fact(final_key, self._secret, waiter=waiter)
            unsigned = None
            if images.unsigned_wanted(target, final) and kernel not in rebuild:
                # Someone else's unsigned image is pushed whenever: a
                # MISSING answer goes stale, and is asked again every poll.
                foreign = images.foreign_unsigned(target) is not None
                unsigned = self.checker.fact(
                    unsigned_key,
                    self._secret,
                    waiter=waiter,
                    recheck_missing=self.settings.poll if foreign else None,
                )
            facts[kernel] = images.Facts(final, unsigned)
            retry.extend(f.retry_at for f in (final, unsigned) if f is not None and f.retry_at)
        # Only a kernel whose final image is known missing may get a pod (a
        # pending or failed check makes none): only its inputs are read.
        missing = {
            k: t for k, t in wanted.items() if facts[k].final.state is existence.State.MISSING
        }
        read = await self._inputs(view, missing) if missing else inputs.Snapshot()
        found = planner.plan(
            view, wanted, facts, read,
            noticed=noticed, settings=self.settings, now=self.now(), rebuild=rebuild,
        )  # fmt: skip
        self._building(view, rebuild, found)
        for at in retry:
            found.requeue(at - self.monotonic())
        return found

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
        if podstatus.phase(pod) == "Succeeded"
    }
