"""A Module's DeviceClasses sent: created, updated and deleted, each refusal its own.

``Sender.send`` carries out what the DRA planner wants
(``dra.planner.DraPlan``: ``classes_apply``, ``classes_delete``,
``conflicts``). A class is created with a plain create (a name someone
else took must fail, not be taken over), updated by server-side apply once
it is the Module's, deleted guarded by its observed uid (one never
observed is nothing of the Module's to delete); each create and delete has
its Event. A refused write is that class's problem (``DeviceClassRefused``,
one Warning Event per distinct refusal, ``telling``) and the rest goes on:
an invalid class (``errors.Invalid``) is remembered with its spec hash and
not sent again until it changes (it would be refused again on every
reconcile); any other refusal is retried with the key's backoff. A listed
name another object holds is a ``DeviceClassConflict``; a cluster that
does not serve resource.k8s.io/v1 is ``ResourceApiUnavailable``, and
nothing is sent.

DeviceClasses are cluster-scoped: nothing namespaced can own them, so the
garbage collector never deletes them. ``Sender.remove`` does, once the
Module is deleted (``finalizing``), or gone from the cache with its
finalizer removed by hand.

Limits: which classes a Module wants is the DRA planner's (pure); which
cached ones are the Module's is ``ownership``'s. Refusals are remembered
per Module until ``forget``.
"""

from __future__ import annotations

from typing import Any

from kmm.api import conditions, labels
from kmm.kube import errors
from kmm.operator import caches, failures, objects, ownership, status, telling, views, writing
from kmm.operator.dra import planner as dra_planner

__all__ = ["Sender"]

RawObject = dict[str, Any]


class Sender:
    def __init__(self, writer: writing.Writer, teller: telling.Teller) -> None:
        self.writer = writer
        self.teller = teller
        # Per Module, DeviceClasses the API server refused: name -> (spec
        # hash, its message). The same class is not sent again (it would be
        # refused again, every reconcile); a changed one is.
        self._refused: dict[str, dict[str, tuple[str | None, str]]] = {}

    def forget(self, key: str) -> None:
        self._refused.pop(key, None)

    async def send(
        self, raw: RawObject, key: str, view: views.ModuleView, plan: dra_planner.DraPlan
    ) -> tuple[list[status.Problem], list[status.Problem]]:
        """Create, update and delete the Module's DeviceClasses; what stands in
        the way, and the refusals to retry with backoff (forbidden, or the
        server's error: an invalid class is not sent again until it changes)."""
        problems: list[status.Problem] = []
        retried: list[status.Problem] = []
        if plan.enabled and not view.resource_api:
            problems.append(
                status.Problem(
                    conditions.REASON_RESOURCE_API_UNAVAILABLE,
                    "the cluster does not serve resource.k8s.io/v1 (DRA): no DeviceClass "
                    "can be made and no claim allocated; restart the operator once it does",
                )
            )
            return problems, retried
        refused = self._refused.setdefault(key, {})
        for name in plan.classes_delete:
            refused.pop(name, None)
            observed = view.device_classes.get(name)
            if observed is None:
                continue  # never observed: nothing of ours to delete
            with failures.step(f"deleting DeviceClass {name}"):
                deleted = await self.writer.delete_device_class(name, observed)
            if deleted:
                await self.teller.event(
                    raw, "Normal", "DeviceClassDeleted", f"deleted DeviceClass {name}"
                )
        listed = {c["metadata"]["name"] for c in plan.classes_apply} | set(plan.conflicts)
        for name in [n for n in refused if n not in listed]:
            del refused[name]  # fixed, or no longer listed
        for desired in plan.classes_apply:
            name = desired["metadata"]["name"]
            digest = objects.observed_hash(desired)
            if name in refused and refused[name][0] == digest:
                problems.append(
                    status.Problem(conditions.REASON_DEVICE_CLASS_REFUSED, refused[name][1])
                )
                continue
            observed = view.device_classes.get(name)
            # A refusal is this class's problem: an invalid class is not
            # sent again until it changes; any other refusal is retried with
            # the key's backoff. Any other failure ends the reconcile.
            try:
                with failures.step(f"sending DeviceClass {name}"):
                    if observed is None:
                        if await self.writer.create_device_class(desired):
                            created = f"created DeviceClass {name}"
                            await self.teller.event(raw, "Normal", "DeviceClassCreated", created)
                    else:
                        await self.writer.apply_device_class(desired, observed)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = (
                    f"{_class_field(view, name)}: the API server refused DeviceClass {name}: "
                    f"{failures.refusal(err)}"
                )
                problem = status.Problem(conditions.REASON_DEVICE_CLASS_REFUSED, message)
                cause = err.cause if isinstance(err, failures.StepFailed) else err
                if isinstance(cause, errors.Invalid):
                    refused[name] = (digest, message)
                    problems.append(problem)
                else:
                    retried.append(problem)
                await self.teller.tell(raw, key, f"DeviceClass/{name}", problem.reason, message)
                continue
            refused.pop(name, None)
            self.teller.settled(key, f"DeviceClass/{name}")
        for name, why in sorted(plan.conflicts.items()):
            problems.append(
                status.Problem(
                    conditions.REASON_DEVICE_CLASS_CONFLICT, f"{_class_field(view, name)}: {why}"
                )
            )
        if not refused:
            self._refused.pop(key, None)
        return problems, retried

    async def remove(self, key: str, raw: RawObject | None, *, cached: views.Caches) -> None:
        """Delete the Module's DeviceClasses, each guarded by its observed uid.
        ``raw`` None: the Module is gone from the cache (its finalizer
        removed by hand), its uid unknown: the classes labelled for it that
        carry a uid label go (kmm stamped them; no live Module has that
        key); unstamped ones are left, as they are never deleted."""
        if raw is not None:
            found = ownership.module_classes(raw, cached.device_classes)
        else:
            found = [
                c
                for c in cached.device_classes.by_index(caches.MODULE_INDEX, key)
                if labels.MODULE_UID in (c["metadata"].get("labels") or {})
            ]
        for observed in found:
            name = observed["metadata"]["name"]
            with failures.step(f"deleting DeviceClass {name}"):
                await self.writer.delete_device_class(name, observed)


def _class_field(view: views.ModuleView, name: str) -> str:
    """The spec path of the listed DeviceClass ``name``."""
    listed = view.module.spec.dra.device_classes if view.module.spec.dra is not None else None
    for index, declared in enumerate(listed or ()):
        if declared.name == name:
            return f"spec.dra.deviceClasses[{index}]"
    return "spec.dra.deviceClasses"
