"""The PreflightValidation reconciler: one key (the validation's name), the
I/O around the pure ``planner``.

Level-based (``runtime.controllers.Reconciler``). For a live validation it:

1. resolves every cached Module for the kernel (``verdicts.subjects``);
2. for the Modules with a target, reads what the planner needs, and only
   that: the ConfigMaps and Secrets a pod reads (GET on demand, no informer
   on Secrets) when the Module has a preflight pod or its image is missing;
   the registry's facts (``existence.Checker``, shared with the build
   concern: remembered, so a converged validation asks no registry) when no
   kept pod decides; ``unsignedImage``'s when a sign-only Module's image is
   missing (asked again every poll while it is missing, as the build
   concern does). A fact with no answer yet is pending (InProgress): the
   check runs in the background and the validation is requeued
   (``enqueue``) when the answer lands, so no reconcile waits on a registry;
3. deletes the pods the planner is done with, creates the ones it wants;
   a create the API server refuses (``failures.refused``: a quota, Pod
   Security, a namespace being deleted) is that Module's verdict, Failure
   naming the refusal, tried again every ``Settings.poll``; the other
   Modules' pods and verdicts go ahead;
4. writes the status subresource only when it differs from the cached one
   (``status.differs``), so a converged validation costs no write.

A validation gone needs nothing: its pods go with it (owner references).
A validation being deleted is left alone. Requeues: a failed pod or missing
inputs every ``Settings.poll`` (fixed inputs send no event), an
unanswered registry after the checker's back-off.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable

from kmm.api import labels, preflight
from kmm.operator import caches, failures, writing
from kmm.operator.build import existence, images
from kmm.operator.build import inputs as build_inputs
from kmm.operator.build import settings as build_settings
from kmm.operator.preflight import planner, status, verdicts
from kmm.runtime import controllers, stores

__all__ = ["PreflightReconciler"]

_log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PreflightReconciler:
    def __init__(
        self,
        validations: stores.Store,
        modules: stores.Store,
        pod_store: stores.Store,
        writer: writing.Writer,
        *,
        checker: existence.Checker,
        reader: build_inputs.Reader,
        settings: build_settings.Settings,
        now: Callable[[], str] = _now,
        monotonic: Callable[[], float] = time.monotonic,
        enqueue: Callable[[str], None] | None = None,
    ) -> None:
        self.validations = validations
        self.modules = modules
        self.pods = pod_store
        self.writer = writer
        self.checker = checker
        self.reader = reader
        self.settings = settings
        self.now = now
        self.monotonic = monotonic
        # Requeues a validation (by name) when a registry answer it waits for lands.
        self.enqueue = enqueue
        # Per validation, the uids of succeeded pods whose pushed image the
        # checker was told to forget (once per pod).
        self._told: dict[str, set[str]] = {}

    async def reconcile(self, key: str) -> controllers.Result:
        raw = self.validations.get(key)
        if raw is None:
            self._told.pop(key, None)
            return controllers.Result()
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            return controllers.Result()
        try:
            found = preflight.parse(raw)
        except preflight.InvalidPreflightValidationError as err:
            # Admission refuses these; one written around it is not judged.
            _log.warning("PreflightValidation %s is invalid, not validated: %s", key, err)
            return controllers.Result()
        judged = verdicts.subjects(preflight.kernel(found), self.modules.objects())
        observed = self.pods.by_index(
            caches.PREFLIGHT_INDEX, labels.preflight_value(found.metadata.name)
        )
        facts, inputs, retry = await self._gather(key, found, judged, observed)
        out = planner.plan(
            found, judged, observed=observed, facts=facts, inputs=inputs, settings=self.settings
        )
        for at in retry:
            out.requeue(at - self.monotonic())
        self._forget(key, out)
        for pod in out.delete:
            await self.writer.delete_pod(pod)
        for pod in out.create:
            await self._create(pod, out)
        wanted = status.compute(found, out.verdicts, now=self.now())
        if status.differs(raw, wanted):
            await self.writer.patch_preflight_status(raw, {"status": wanted})
        return controllers.Result(requeue_after=out.requeue_after)

    async def _create(self, pod: stores.RawObject, out: planner.Plan) -> None:
        """Create a Module's preflight pod; a refusal is the Module's verdict."""
        metadata = pod["metadata"]
        try:
            await self.writer.create_pod(pod)
        except Exception as err:
            if not failures.refused(err):
                raise
            pod_labels = metadata.get("labels") or {}
            key = f"{pod_labels.get(labels.MODULE_NAMESPACE)}/{pod_labels.get(labels.MODULE_NAME)}"
            before = out.verdicts.get(key)
            out.verdicts[key] = verdicts.failure(
                f"{preflight.REASON_BUILD_FAILED}: the API server refused pod "
                f"{metadata['namespace']}/{metadata['name']}: {failures.refusal(err)}",
                image=before.image if before is not None else None,
            )
            # A freed quota or a relabelled namespace sends no event.
            out.requeue(self.settings.poll)

    async def _gather(
        self,
        key: str,
        found: preflight.PreflightValidation,
        judged: list[verdicts.Subject],
        observed: list[stores.RawObject],
    ) -> tuple[dict[str, images.Facts], dict[str, build_inputs.Snapshot], list[float]]:
        """Existence facts and inputs, by Module key, and when facts that
        got no answer are due again."""
        facts: dict[str, images.Facts] = {}
        inputs: dict[str, build_inputs.Snapshot] = {}
        retry: list[float] = []
        waiter = existence.Waiter(self.enqueue, key) if self.enqueue is not None else None
        for subject in judged:
            if subject.target is None or subject.module is None:
                continue
            read: build_inputs.Snapshot | None = None
            if subject.makes and planner.observed_pod(found, subject, observed) is not None:
                read = await self._inputs(subject)
            if planner.asks_registry(found, subject, observed, read, self.settings):
                final_key, unsigned_key = images.keys(subject.module, subject.target)
                final = self.checker.fact(final_key, self._secret, waiter=waiter)
                unsigned = None
                if planner.unsigned_wanted(subject.target, final):
                    # Someone else pushes it: a missing one is asked again every poll.
                    unsigned = self.checker.fact(
                        unsigned_key,
                        self._secret,
                        waiter=waiter,
                        recheck_missing=self.settings.poll,
                    )
                facts[subject.key] = images.Facts(final, unsigned)
                retry.extend(f.retry_at for f in (final, unsigned) if f is not None and f.retry_at)
                if subject.makes and read is None and final.state is existence.State.MISSING:
                    read = await self._inputs(subject)
            if read is not None:
                inputs[subject.key] = read
        return facts, inputs, retry

    def _forget(self, key: str, out: planner.Plan) -> None:
        """What the checker must ask again: an image a preflight pod pushed
        (once per pod)."""
        told = self._told.get(key, set())
        for uid, image in out.pushed.items():
            if uid not in told:
                self.checker.forget(image)
        self._told[key] = set(out.pushed)

    async def _secret(self, namespace: str, name: str) -> stores.RawObject | None:
        return await self.reader.get("Secret", namespace, name)

    async def _inputs(self, subject: verdicts.Subject) -> build_inputs.Snapshot:
        wanted = planner.inputs_wanted(subject)
        return await build_inputs.read(self.reader, subject.namespace, wanted)
