"""The Module reconciler: one key (``<ns>/<name>``), the whole loader + plugin state.

Level-based (``runtime.controllers.Reconciler``). For a live Module it:
1. keeps the finalizer on it (node labels are not ownable; DESIGN §5);
2. repeats admission (``kmm.api.validation``): an invalid Module gets a
   Degraded condition and one Warning Event, and nothing is created;
3. applies the loader plan (``moduleloader``) and the device-plugin plan
   (``deviceplugin``): DaemonSets sent only when missing or changed, stale
   ones deleted, an Event for each create and delete;
4. brings node labels to the truth (``nodelabels``);
5. writes the status (``status``) only when a field it owns changes, and
   counts-only changes at most once per ``STATUS_INTERVAL`` (requeued).
For a Module being deleted it removes its node labels, then the finalizer;
the garbage collector deletes the DaemonSets it owns (seed 000 step 6).
Everything is read from the informer caches; a converged Module costs no write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

from kmm.api import labels, validation
from kmm.operator import caches, deviceplugin, events, moduleloader, nodelabels, status, writing
from kmm.runtime import controllers, stores

__all__ = ["Caches", "ModuleReconciler", "rfc3339_now"]

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]

# Node label patches in flight at once: enough to converge 500 nodes quickly,
# few enough not to swamp the API server's inflight limit.
_PARALLEL_WRITES = 16
# While a rollout progresses, counts change with every pod; a status write
# that only moves counts waits until this long after the previous one (a
# condition changing state is written at once). 500 nodes: ~30 status
# writes instead of ~450.
STATUS_INTERVAL = 1.0


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Caches:
    """The stores the reconciler reads (the informers own and fill them)."""

    modules: stores.Store
    daemonsets: stores.Store
    pods: stores.Store
    nodes: stores.Store


def _role(obj: RawObject) -> str | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(labels.ROLE)
    return value if isinstance(value, str) else None


class ModuleReconciler:
    def __init__(
        self,
        cached: Caches,
        writer: writing.Writer,
        *,
        instance: str = "kmm-operator",
        now: Callable[[], str] = rfc3339_now,
        monotonic: Callable[[], float] = time.monotonic,
        status_interval: float = STATUS_INTERVAL,
    ) -> None:
        self.caches = cached
        self.writer = writer
        self.instance = instance
        self.now = now
        self.monotonic = monotonic
        self.status_interval = status_interval
        self._status_written: dict[str, float] = {}

    async def reconcile(self, key: str) -> controllers.Result:
        raw = self.caches.modules.get(key)
        if raw is None:
            # Normally the finalizer cleaned up; labels left behind (the
            # finalizer removed by hand, a crash between the two) go now.
            self._status_written.pop(key, None)
            namespace, _, name = key.partition("/")
            await self._remove_labels(namespace, name)
            return controllers.Result()
        metadata = raw["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        finalizers: list[str] = list(metadata.get("finalizers") or ())
        if metadata.get("deletionTimestamp"):
            await self._clean_up(raw, namespace, name, finalizers)
            return controllers.Result()
        if labels.FINALIZER not in finalizers:
            await self.writer.set_finalizers(raw, [*finalizers, labels.FINALIZER])
        try:
            module = validation.parse_module(raw)
        except validation.InvalidModuleError as err:
            await self._refuse(raw, str(err))
            return controllers.Result()

        owned = self.caches.daemonsets.by_index(caches.MODULE_INDEX, key)
        pods = self.caches.pods.by_index(caches.MODULE_INDEX, key)
        loader_pods = [p for p in pods if _role(p) == "module-loader"]
        plugin_pods = [p for p in pods if _role(p) == "device-plugin"]
        has_loader = module.spec.module_loader is not None
        has_plugin = module.spec.device_plugin is not None
        selected = moduleloader.selected_nodes(module, self.caches.nodes.objects())
        loader = moduleloader.plan(
            module,
            selected if has_loader else [],
            [d for d in owned if _role(d) == "module-loader"],
            loader_pods,
        )
        plugin = deviceplugin.plan(module, [d for d in owned if _role(d) == "device-plugin"])
        await self._send_daemonsets(raw, [*loader.to_apply, *plugin.to_apply])
        await self._delete_daemonsets(raw, [*loader.to_delete, *plugin.to_delete])

        loaded = moduleloader.ready_nodes(loader.node_pairs, loader_pods)
        plugin_ready = deviceplugin.ready_nodes(plugin_pods) if has_plugin else set()
        # Candidates: nodes the Module selects, and nodes still carrying its labels.
        labelled = self.caches.nodes.by_index(caches.MODULE_INDEX, key)
        candidates = {n["metadata"]["name"]: n for n in [*selected, *labelled]}
        changes = nodelabels.changes(
            candidates.values(),
            namespace=namespace,
            name=name,
            kernel_labels=loader.kernel_labels,
            ready=loaded,
            plugin_ready=plugin_ready,
        )
        await self._patch_labels(candidates, changes)

        # The plugin runs where the module is loaded, or on every selected
        # node for an in-tree driver.
        plugin_wanted = (len(loaded) if has_loader else len(selected)) if has_plugin else 0
        seen = status.Observed(
            selected=len(selected),
            loader=status.counts(len(selected), loader.current) if has_loader else None,
            plugin=status.counts(plugin_wanted, plugin.current) if has_plugin else None,
            targeted=len(loader.node_pairs),
            ready=len(loaded),
            plugin_wanted=plugin_wanted,
            plugin_ready=len(plugin_ready),
            mapping_errors=loader.grouping.errors,
        )
        new = status.compute(raw, seen, now=self.now())
        if not status.differs(raw, new):
            return controllers.Result()
        if status.only_progress(raw, new):
            wait = self._status_written.get(key, -1e9) + self.status_interval - self.monotonic()
            if wait > 0:
                return controllers.Result(requeue_after=wait)
        await self.writer.patch_module_status(raw, status.patch_body(new))
        self._status_written[key] = self.monotonic()
        return controllers.Result()

    async def _send_daemonsets(self, raw: RawObject, desired: list[RawObject]) -> None:
        namespace = raw["metadata"]["namespace"]
        for obj in desired:
            ds_name = obj["metadata"]["name"]
            observed = self.caches.daemonsets.get(f"{namespace}/{ds_name}")
            if await self.writer.apply_daemonset(obj, observed):
                await self._event(raw, "Normal", "DaemonSetCreated", f"created DaemonSet {ds_name}")

    async def _delete_daemonsets(self, raw: RawObject, names: list[str]) -> None:
        namespace = raw["metadata"]["namespace"]
        for ds_name in names:
            observed = self.caches.daemonsets.get(f"{namespace}/{ds_name}") or {}
            if await self.writer.delete_daemonset(namespace, ds_name, observed):
                await self._event(raw, "Normal", "DaemonSetDeleted", f"deleted DaemonSet {ds_name}")

    async def _refuse(self, raw: RawObject, message: str) -> None:
        new = status.invalid(raw, message, now=self.now())
        if not status.differs(raw, new):
            return
        await self.writer.patch_module_status(raw, status.patch_body(new))
        await self._event(raw, "Warning", "InvalidSpec", message)

    async def _clean_up(
        self, raw: RawObject, namespace: str, name: str, finalizers: list[str]
    ) -> None:
        if labels.FINALIZER not in finalizers:
            return
        await self._remove_labels(namespace, name)
        await self.writer.set_finalizers(raw, [f for f in finalizers if f != labels.FINALIZER])

    async def _remove_labels(self, namespace: str, name: str) -> None:
        labelled = self.caches.nodes.by_index(caches.MODULE_INDEX, f"{namespace}/{name}")
        changes = nodelabels.changes(
            labelled, namespace=namespace, name=name, kernel_labels={}, ready=(), plugin_ready=()
        )
        await self._patch_labels({n["metadata"]["name"]: n for n in labelled}, changes)

    async def _patch_labels(
        self, nodes: dict[str, RawObject], changes: nodelabels.LabelChanges
    ) -> None:
        limit = asyncio.Semaphore(_PARALLEL_WRITES)

        async def one(node_name: str, change: dict[str, str | None]) -> None:
            async with limit:
                await self.writer.patch_node_labels(nodes[node_name], change)

        await _all(one(n, c) for n, c in sorted(changes.items()))

    async def _event(
        self, raw: RawObject, type_: Literal["Normal", "Warning"], reason: str, message: str
    ) -> None:
        await self.writer.create_event(
            events.event(
                raw,
                type_=type_,
                reason=reason,
                message=message,
                now=self.now(),
                instance=self.instance,
            )
        )


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Run writes concurrently; every one finishes before the first error is raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
