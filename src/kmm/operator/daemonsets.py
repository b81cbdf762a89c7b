"""A Module's DaemonSets sent: applied, deleted, and loader pods replaced.

``Sender.apply`` sends each DaemonSet the planners want by server-side
apply (``writing.Writer.apply_daemonset``: only when missing or changed),
with a ``DaemonSetCreated`` Event for a new one. A refused apply stays
local: it is the Module's ``DaemonSetRefused`` problem, with the server's
words and one Warning Event per distinct refusal (``telling``), and the
other DaemonSets still go.

``Sender.delete`` deletes the Module's DaemonSets of the names given, each
guarded by its observed uid, with a ``DaemonSetDeleted`` Event. A name that
is no DaemonSet of the Module's in the cache (``ownership``) is nothing to
delete: never one of that name someone else has in the Module's namespace.

``Sender.replace_loader_pods`` deletes the loader pods of an older pinned
image that never became Ready (``loader.planner``'s ``replace``), with a
``LoaderPodReplaced`` Event, so their DaemonSet makes them again.

Limits: which DaemonSets and pods go is the planners' to say (and, for a
Module being deleted, ``finalizing``'s order); this module sends and tells,
and remembers nothing of its own.
"""

from __future__ import annotations

import logging
from typing import Any

from kmm.api import conditions
from kmm.operator import failures, ownership, status, telling, views, writing

__all__ = ["Sender"]

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]


class Sender:
    def __init__(self, writer: writing.Writer, teller: telling.Teller) -> None:
        self.writer = writer
        self.teller = teller

    async def apply(
        self, raw: RawObject, key: str, desired: list[RawObject], *, cached: views.Caches
    ) -> list[status.Problem]:
        """Apply each DaemonSet; the refusals, each the Module's problem."""
        namespace = raw["metadata"]["namespace"]
        refused: list[status.Problem] = []
        for obj in desired:
            ds_name = obj["metadata"]["name"]
            observed = cached.daemonsets.get(f"{namespace}/{ds_name}")
            try:
                with failures.step(f"applying DaemonSet {ds_name}"):
                    created = await self.writer.apply_daemonset(obj, observed)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = f"the API server refused DaemonSet {ds_name}: {failures.refusal(err)}"
                refused.append(status.Problem(conditions.REASON_DAEMONSET_REFUSED, message))
                what = f"DaemonSet/{ds_name}"
                await self.teller.tell(raw, key, what, conditions.REASON_DAEMONSET_REFUSED, message)
                continue
            self.teller.settled(key, f"DaemonSet/{ds_name}")
            if created:
                await self.teller.event(
                    raw, "Normal", "DaemonSetCreated", f"created DaemonSet {ds_name}"
                )
        return refused

    async def delete(self, raw: RawObject, names: list[str], *, cached: views.Caches) -> None:
        """Delete the Module's DaemonSets of ``names``, each guarded by its
        observed uid; a name that is not the Module's is left."""
        namespace = raw["metadata"]["namespace"]
        ours = {
            ds["metadata"]["name"]: ds for ds in ownership.module_daemonsets(raw, cached.daemonsets)
        }
        for ds_name in names:
            observed = ours.get(ds_name)
            if observed is None:
                _log.warning(
                    "%s: DaemonSet %s is not the Module's: not deleted", namespace, ds_name
                )
                continue
            with failures.step(f"deleting DaemonSet {ds_name}"):
                deleted = await self.writer.delete_daemonset(observed)
            if deleted:
                await self.teller.event(
                    raw, "Normal", "DaemonSetDeleted", f"deleted DaemonSet {ds_name}"
                )

    async def replace_loader_pods(self, raw: RawObject, found: list[RawObject]) -> None:
        """Delete loader pods of an older image that never loaded (``loader.planner``)."""
        for pod in found:
            name = pod["metadata"]["name"]
            with failures.step(f"deleting pod {name}"):
                deleted = await self.writer.delete_pod(pod)
            if deleted:
                node = (pod.get("spec") or {}).get("nodeName") or "no node yet"
                message = (
                    f"deleted loader pod {name} ({node}): it never loaded and runs an older image"
                )
                await self.teller.event(raw, "Normal", "LoaderPodReplaced", message)
