"""Informers: keep a `stores.Store` true to the API server and tell handlers.

One informer per (resource, label selector): a `kube.reflecting.Reflector`
(list in pages, then watch; resume, relist on 410, back off on errors) whose
sink is the store. A relist replaces the store (handlers see adds, updates of
changed objects, deletes of vanished ones) and marks the informer synced;
each watch event updates it.

A relist also calls each relist hook (``add_relist_hook``) with the list's
resourceVersion once the store holds it: an object made and deleted in the
watch gap it closes was never shown, and no handler hears of it; a hook
learns that everything up to that version is now shown.

Handlers are synchronous and must be quick (they enqueue keys); an exception
in one is logged, counted (``HandlerErrors``: ``kmm_handler_errors_total`` in
the operator) and does not stop the informer; the event it was handling is
then lost to that handler, and the periodic resync (``resyncing``) heals it.
An update whose projection differs from the cached one only in
``resourceVersion`` is stored but not handed to handlers: nothing they read
changed (a kubelet's or KWOK's heartbeat, for the fields the operator keeps
of a Node). What the store keeps is the
`projection` of each object (default: drop `metadata.managedFields`); with
`stores.keep_fields` for the fields its controllers read, 5,000 Nodes take
about 12 MiB (tests/unit/runtime/test_memory.py): equal values outside
`metadata` (a kernel, a taint list) are stored once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from kmm.aio import backoff, clocks, tasks
from kmm.kube import listwatch, reflecting
from kmm.runtime import stores

__all__ = ["FuncHandler", "Handler", "HandlerErrors", "Informer", "drop_managed_fields"]

_log = logging.getLogger(__name__)


class Handler(Protocol):
    def on_add(self, obj: stores.RawObject) -> None: ...

    def on_update(self, old: stores.RawObject, new: stores.RawObject) -> None: ...

    def on_delete(self, obj: stores.RawObject) -> None: ...


class HandlerErrors(Protocol):
    """Told of every handler call that raised: the informer's name and the
    handler method (``on_add`` / ``on_update`` / ``on_delete``)."""

    def handler_failed(self, informer: str, method: str) -> None: ...


@dataclasses.dataclass
class FuncHandler:
    """A Handler from optional functions; most controllers map all three to one."""

    add: Callable[[stores.RawObject], None] | None = None
    update: Callable[[stores.RawObject, stores.RawObject], None] | None = None
    delete: Callable[[stores.RawObject], None] | None = None

    @classmethod
    def each(cls, func: Callable[[stores.RawObject], None]) -> FuncHandler:
        """Call `func` with the current object on add and update, the last on delete."""
        return cls(add=func, update=lambda _old, new: func(new), delete=func)

    def on_add(self, obj: stores.RawObject) -> None:
        if self.add is not None:
            self.add(obj)

    def on_update(self, old: stores.RawObject, new: stores.RawObject) -> None:
        if self.update is not None:
            self.update(old, new)

    def on_delete(self, obj: stores.RawObject) -> None:
        if self.delete is not None:
            self.delete(obj)


def drop_managed_fields(obj: stores.RawObject) -> stores.RawObject:
    """The default projection: everything but managedFields, compacted."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    result: stores.RawObject = stores.compact(obj)
    return result


class Informer:
    def __init__(
        self,
        name: str,
        source: listwatch.ListWatch,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        projection: stores.Projection = drop_managed_fields,
        indexers: Mapping[str, stores.Indexer] | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        initial_backoff: float = 0.8,
        max_backoff: float = 30.0,
        clock: clocks.Clock | None = None,
        handler_errors: HandlerErrors | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.handler_errors = handler_errors
        self.store = stores.Store(indexers=indexers)
        self.reflector = reflecting.Reflector(
            name,
            source,
            self,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=page_size,
            watch_timeout=watch_timeout,
            delays=backoff.Backoff(initial=initial_backoff, maximum=max_backoff, jitter=0.0),
            clock=clock,
            projection=projection,
        )
        self._handlers: list[Handler] = []
        self._relist_hooks: list[Callable[[str], None]] = []
        self._synced = asyncio.Event()

    @property
    def resource_version(self) -> str | None:
        return self.reflector.resource_version

    @property
    def lists(self) -> int:
        return self.reflector.lists

    @property
    def watches(self) -> int:
        return self.reflector.watches

    @property
    def relists(self) -> Mapping[str, int]:
        """Completed lists by reason (``kube.reflecting.START`` / ``GONE``)."""
        return self.reflector.relists

    def add_handler(self, handler: Handler) -> None:
        """Register before `run`; a late handler misses earlier events."""
        self._handlers.append(handler)

    def add_relist_hook(self, hook: Callable[[str], None]) -> None:
        """Register before `run`: ``hook(resource_version)`` after each list."""
        self._relist_hooks.append(hook)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def run(self, stop: asyncio.Event) -> None:
        await tasks.run_until(stop, self.reflector.run(), name=f"informer/{self.name}")

    # -- the reflector's sink ---------------------------------------------

    def replace(self, items: list[stores.RawObject], resource_version: str) -> None:
        fresh = {stores.key_of(obj): obj for obj in items}
        for key in self.store.list_keys():
            if key not in fresh:
                old = self.store.delete(key)
                if old is not None:
                    self._notify("on_delete", old)
        for obj in fresh.values():
            old = self.store.put(obj)
            if old is None:
                self._notify("on_add", obj)
            elif not _same_apart_from_version(old, obj):
                self._notify("on_update", old, obj)
        for hook in self._relist_hooks:
            try:
                hook(resource_version)
            except Exception:
                _log.exception("%s: relist hook failed", self.name)
                if self.handler_errors is not None:
                    self.handler_errors.handler_failed(self.name, "relisted")
        self._synced.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        obj = event["object"]
        kind = event["type"]
        if kind == "BOOKMARK":
            return
        if kind in ("ADDED", "MODIFIED"):
            old = self.store.put(obj)
            if old is None:
                self._notify("on_add", obj)
            elif not _same_apart_from_version(old, obj):
                self._notify("on_update", old, obj)
        elif kind == "DELETED":
            old = self.store.delete(stores.key_of(obj))
            self._notify("on_delete", old if old is not None else obj)
        else:
            _log.warning("%s: unexpected watch event type %r", self.name, kind)

    def _notify(self, method: str, *objs: stores.RawObject) -> None:
        for handler in self._handlers:
            try:
                getattr(handler, method)(*objs)
            except Exception:
                _log.exception("%s: handler %s failed; the resync will heal it", self.name, method)
                if self.handler_errors is not None:
                    self.handler_errors.handler_failed(self.name, method)


def _same_apart_from_version(old: stores.RawObject, new: stores.RawObject) -> bool:
    """Whether two projections of an object differ in nothing but resourceVersion."""
    if old.keys() != new.keys():
        return False
    for name, value in old.items():
        if name != "metadata":
            if value != new[name]:
                return False
            continue
        other = new[name]
        if not isinstance(value, dict) or not isinstance(other, dict):
            return bool(value == other)
        if value.keys() != other.keys() or any(
            value[field] != other[field] for field in value if field != "resourceVersion"
        ):
            return False
    return True
