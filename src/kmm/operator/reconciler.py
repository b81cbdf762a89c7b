"""The Module reconciler: one key (``<ns>/<name>``), every concern of the Module.

Level-based (``runtime.controllers.Reconciler``). For a live Module it:
1. keeps the finalizer on it (node labels are not ownable; DESIGN §5);
2. repeats admission (``kmm.api.validation``): an invalid Module gets a
   Degraded condition and one Warning Event, and nothing is created;
3. takes one read-only view of the caches (``views.read``) and asks what
   each concern wants: ``build`` first (for kernels whose mapping builds or
   signs: which images exist, asked of registries only when not known,
   ``build.concern``; which build and sign pods to make; which kernels
   wait for their image), then the other planners in order (``planners``:
   the loader, which skips those kernels, the device plugin and DRA
   driver, the ordered upgrade);
4. sends what they want, each kind of object by its sender: build, sign
   and pull pods (``imagepods``), DaemonSets applied when missing or
   changed and stale ones deleted, loader pods of an older pinned image
   that never became Ready replaced (``daemonsets``), DeviceClasses
   (``deviceclasses``), the DeviceTaintRules of a DRA Module's moving
   nodes (``taintrules``), and the node labels all of them want, merged into
   one patch per node (``nodelabels``) and sent (``labelling``, with a
   Node Event when ``.ready`` comes or goes); each with its Events
   (``telling``); then asks whether admission lets the pods of its
   DaemonSets in (``podadmission``);
5. writes the status (``status``, ``status.images`` among it) only when a
   field it owns changes, and counts-only changes at most once per
   ``STATUS_INTERVAL`` (requeued); a Module whose build or sign pod failed
   (or whose pod is still on its way) is requeued every
   ``--build-input-poll`` seconds to notice changed inputs.
A loader pod whose hook failed is the Module's ``ModuleLoadFailed``, with
what the hook reported (``loader.reports``, through ``planners.observed``).
A write the API server refuses (``failures.refused``: invalid, forbidden,
its own 500) stays local, shown where it belongs by its sender; the other
objects, the labels and the status still go, and the key is retried with
backoff (``Result.requeue``).
When a step raises otherwise (a planner's bug, an error that is not one
object's), the Module shows it before the controller retries the key with
backoff (``failures``): Degraded ``ReconcileFailed`` naming the step, and a
Warning Event once per distinct message, not once per retry; the next
reconcile that goes through sets Degraded back. Conflicts, throttling and an
unavailable API server are retried without showing.
A Module being deleted is taken down in order before its finalizer goes,
and one gone from the cache has what it left behind removed
(``finalizing``).
Everything is read from the informer caches; a converged Module costs no write.

The DRA part is a planner in this reconcile, not a controller of its own
(the seed's "DRA reconciler"): the target labels, the loader's ``.ready``
and the version labels it is gated by are one node's labels, merged into
one patch, judged at one moment.

Limits: this module drives the steps and owns the Module's status; it
plans nothing itself (the planners do) and sends no object but the
Module's own status and finalizer (the senders do). It holds every
per-Module memory (its own and its senders'), and forgets them all when the
Module is gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from kmm.api import conditions, labels, validation
from kmm.operator import (
    daemonsets,
    deviceclasses,
    failures,
    finalizing,
    imagepods,
    labelling,
    nodelabels,
    planners,
    podadmission,
    status,
    taintrules,
    telling,
    views,
    writing,
)
from kmm.operator.build import concern as build_concern
from kmm.operator.build import planner as build_planner
from kmm.operator.loader import planner as loader_planner
from kmm.runtime import controllers

__all__ = ["ModuleReconciler", "rfc3339_now"]

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]

# While a rollout progresses, counts change with every pod; a status write
# that only moves counts waits until this long after the previous one (a
# condition changing state is written at once). 500 nodes: ~30 status
# writes instead of ~450.
STATUS_INTERVAL = 1.0


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ModuleReconciler:
    def __init__(
        self,
        cached: views.Caches,
        writer: writing.Writer,
        *,
        instance: str = "kmm-operator",
        now: Callable[[], str] = rfc3339_now,
        monotonic: Callable[[], float] = time.monotonic,
        status_interval: float = STATUS_INTERVAL,
        build: build_concern.BuildConcern | None = None,
        admission: podadmission.PodAdmission | None = None,
    ) -> None:
        self.caches = cached
        # None: no image is checked or built (tests of other concerns).
        self.build = build
        # None: no DaemonSet's pods are tried (tests of other concerns).
        self.admission = admission
        self.writer = writer
        self.instance = instance
        self.now = now
        self.monotonic = monotonic
        self.status_interval = status_interval
        self._status_written: dict[str, float] = {}
        # Per failing Module, the failure message its last Warning Event
        # gave; gone once a reconcile of the key goes through (the Module
        # recovered, or is gone).
        self._shown: dict[str, str] = {}
        self._teller = telling.Teller(writer, now=now, instance=instance)
        self._image_pods = imagepods.Sender(writer, self._teller)
        self._daemonsets = daemonsets.Sender(writer, self._teller)
        self._classes = deviceclasses.Sender(writer, self._teller)
        self._rules = taintrules.Sender(writer, self._teller)
        self._labels = labelling.Sender(writer, self._teller)
        self._finalizer = finalizing.Finalizer(
            writer,
            daemonset_sender=self._daemonsets,
            label_sender=self._labels,
            class_sender=self._classes,
            rule_sender=self._rules,
        )

    async def reconcile(self, key: str) -> controllers.Result:
        try:
            result = await self._reconcile(key)
        except Exception as err:
            if not failures.transient(err):
                await self._show_failure(key, failures.describe(err))
            raise  # the controller retries the key with its backoff
        self._shown.pop(key, None)
        return result

    async def _reconcile(self, key: str) -> controllers.Result:
        raw = self.caches.modules.get(key)
        if raw is None:
            self._forget(key)
            await self._finalizer.leftovers(key, cached=self.caches)
            return controllers.Result()
        metadata = raw["metadata"]
        finalizers: list[str] = list(metadata.get("finalizers") or ())
        if metadata.get("deletionTimestamp"):
            await self._finalizer.clean_up(raw, finalizers, cached=self.caches)
            return controllers.Result()
        if labels.FINALIZER not in finalizers:
            with failures.step("adding the finalizer"):
                await self.writer.set_finalizers(raw, [*finalizers, labels.FINALIZER])
        try:
            module = validation.parse_module(raw)
        except validation.InvalidModuleError as err:
            await self._refuse(raw, str(err))
            return controllers.Result()

        with failures.step("reading the caches"):
            view = views.read(raw, module, key=key, cached=self.caches)
        building = await self._plan_build(view)
        asked = planners.ask(view, gated=building.gated, pins=building.digests)
        concerns = asked.concerns()
        # Refused writes (each one object's) do not stop the others.
        building, refused = await self._image_pods.send(raw, view, building, concern=self.build)
        refused += await self._daemonsets.apply(
            raw, key, [ds for plan in concerns for ds in plan.apply], cached=self.caches
        )
        await self._daemonsets.delete(
            raw, [name for plan in concerns for name in plan.delete], cached=self.caches
        )
        await self._daemonsets.replace_loader_pods(raw, asked.loader.replace)
        problems, retried = await self._classes.send(raw, key, view, asked.driver)
        refused += retried
        # Before the labels: a node's driver leaves only once its rules are seen.
        refused += await self._rules.send(raw, key, asked.taints)
        with failures.step("merging the node labels"):
            changes = nodelabels.merge(view.nodes(), concerns)
        await self._labels.patch(changes, cached=self.caches, view=view)
        self._labels.loaded(key, asked.loader.versions)
        admitted = await self._check_pods(raw, key, view)

        with failures.step("computing the status"):
            seen = planners.observed(
                view, asked, [*refused, *admitted.refused.values(), *building.problems, *problems]
            )
            seen = dataclasses.replace(
                seen,
                images=building.images,
                image_rebuild_trigger_generation=self._trigger_generation(view, building),
            )
            new = status.compute(raw, seen, now=self.now())
        # Refused: asked again with the key's backoff (a quota freed, a
        # policy changed, a server error gone send the Module no event).
        later = controllers.Result(
            requeue=bool(refused),
            requeue_after=_soonest(building.requeue_after, admitted.requeue_after),
        )
        if not status.differs(raw, new):
            return later
        if status.only_progress(raw, new):
            wait = self._status_written.get(key, -1e9) + self.status_interval - self.monotonic()
            if wait > 0:
                return controllers.Result(
                    requeue=later.requeue, requeue_after=_soonest(wait, later.requeue_after)
                )
        with failures.step("writing the status"):
            written = await self.writer.patch_module_status(raw, status.patch_body(new))
        if written:
            self._status_written[key] = self.monotonic()
        return later

    def _forget(self, key: str) -> None:
        """Every memory of the Module ``key``, gone from the cache."""
        self._status_written.pop(key, None)
        self._labels.forget(key)
        self._classes.forget(key)
        self._teller.forget(key)
        if self.admission is not None:
            self.admission.forget(key)
        if self.build is not None:
            self.build.forget_module(key)

    async def _plan_build(self, view: views.ModuleView) -> build_planner.BuildPlan:
        """What the build concern wants; an empty plan when it is not wired."""
        if self.build is None:
            return build_planner.BuildPlan()
        with failures.step("planning the image builds"):
            # The loader groups the nodes again; only Modules that build pay twice.
            builds = build_planner.module_builds(view.module)
            targets = loader_planner.grouping(view).targets if builds else {}
            return await self.build.plan(view, targets)

    def _trigger_generation(
        self, view: views.ModuleView, building: build_planner.BuildPlan
    ) -> int | None:
        if self.build is None:
            found = view.module.status
            return found.image_rebuild_trigger_generation if found is not None else None
        return self.build.trigger_generation(view, building)

    async def _check_pods(
        self, raw: RawObject, key: str, view: views.ModuleView
    ) -> podadmission.Checked:
        """Whether admission lets in the pods of the Module's DaemonSets."""
        if self.admission is None:
            return podadmission.Checked()
        found = [ds for group in view.daemonsets.values() for ds in group]
        checked = await self.admission.refusals(key, found)
        for name, problem in checked.refused.items():
            await self._teller.tell(raw, key, f"Pods/{name}", problem.reason, problem.message)
        return checked

    async def _show_failure(self, key: str, message: str) -> None:
        """Degraded with ``message``, and a Warning Event unless it is the one
        shown last. Best effort: the failure itself is raised on and retried."""
        raw = self.caches.modules.get(key)
        if raw is None:
            return
        new = status.failed(raw, message, now=self.now())
        if status.differs(raw, new):
            try:
                await self.writer.patch_module_status(raw, status.patch_body(new))
            except Exception as err:
                _log.warning("%s: status not written: %s", key, err)
        if self._shown.get(key) == message:
            return
        self._shown[key] = message
        try:
            await self._teller.event(raw, "Warning", conditions.REASON_RECONCILE_FAILED, message)
        except Exception as err:
            _log.warning("%s: event not written: %s", key, err)

    async def _refuse(self, raw: RawObject, message: str) -> None:
        new = status.invalid(raw, message, now=self.now())
        if not status.differs(raw, new):
            return
        # One Event per refusal: a reconcile in the cache gap (the status
        # write not seen yet) finds the same patch in flight and says nothing.
        with failures.step("writing the status"):
            written = await self.writer.patch_module_status(raw, status.patch_body(new))
        if written:
            await self._teller.event(raw, "Warning", "InvalidSpec", message)


def _soonest(*delays: float | None) -> float | None:
    """The shortest of the delays given, None if none is."""
    given = [d for d in delays if d is not None]
    return min(given) if given else None
