"""Informers: keep a `stores.Store` true to the API server and tell handlers.

One informer per (resource, label selector). Its loop, like client-go's
reflector:
1. list in pages (`listwatch.ListWatch.list_page`), project each object,
   replace the store (handlers see adds, updates of changed objects, deletes
   of vanished ones), remember the list's resourceVersion, mark synced;
2. watch from that resourceVersion with bookmarks, applying events and moving
   the resourceVersion forward (bookmarks move it without an object);
3. a watch that ends normally (server timeout) resumes at once from the last
   resourceVersion; 410 Gone relists at once; errors, and watches that end
   without any event, back off exponentially (`initial_backoff` doubling to
   `max_backoff`) and then resume.

Handlers are synchronous and must be quick (they enqueue keys); an exception
in one is logged and does not stop the informer. What the store keeps is the
`projection` of each object (default: drop `metadata.managedFields`); with
`stores.keep_fields` for the fields its controllers read, 5,000 Nodes take
about 14 MiB (tests/unit/runtime/test_memory.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from kmm.runtime import clocks, listwatch, stores, tasks

__all__ = ["FuncHandler", "Handler", "Informer", "drop_managed_fields"]

_log = logging.getLogger(__name__)


class Handler(Protocol):
    def on_add(self, obj: stores.RawObject) -> None: ...

    def on_update(self, old: stores.RawObject, new: stores.RawObject) -> None: ...

    def on_delete(self, obj: stores.RawObject) -> None: ...


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


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    metadata = obj.get("metadata") or {}
    value = metadata.get("resourceVersion")
    return value if isinstance(value, str) and value else None


# Errors after which a watch or list is retried with backoff. Anything else is
# a bug and ends the informer (and the manager with it).
_TRANSIENT = (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


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
    ) -> None:
        self.name = name
        self.source = source
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.projection = projection
        self.store = stores.Store(indexers=indexers)
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()
        self.resource_version: str | None = None
        # Counters for tests and metrics: how often each thing happened.
        self.lists = 0
        self.watches = 0

    def add_handler(self, handler: Handler) -> None:
        """Register before `run`; a late handler misses earlier events."""
        self._handlers.append(handler)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def run(self, stop: asyncio.Event) -> None:
        await tasks.run_until(stop, self._loop(), name=f"informer/{self.name}")

    async def _loop(self) -> None:
        backoff = self.initial_backoff
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                if await self._watch():
                    backoff = self.initial_backoff
                    continue
                # A watch that ends without a single event (bookmarks included)
                # is a server or proxy cutting us off: back off, do not spin.
                _log.info("%s: watch ended without events, retry in %.1fs", self.name, backoff)
            except _TRANSIENT as error:
                if listwatch.is_gone(error):
                    # Relist at once: the server told us our version is too old.
                    _log.info("%s: resourceVersion gone, relisting", self.name)
                    self.resource_version = None
                    continue
                _log.warning("%s: list/watch failed, retry in %.1fs: %s", self.name, backoff, error)
            await self._clock.sleep(backoff)
            backoff = min(self.max_backoff, backoff * 2)

    async def _relist(self) -> None:
        self.lists += 1
        fresh: dict[stores.Key, stores.RawObject] = {}
        token: str | None = None
        while True:
            page = await self.source.list_page(
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                limit=self.page_size,
                continue_token=token,
            )
            for item in page["items"]:
                obj = self.projection(item)
                fresh[stores.key_of(obj)] = obj
            token = page["continue_token"]
            if token is None:
                break
        for key in self.store.list_keys():
            if key not in fresh:
                old = self.store.delete(key)
                if old is not None:
                    self._notify("on_delete", old)
        for obj in fresh.values():
            old = self.store.put(obj)
            if old is None:
                self._notify("on_add", obj)
            elif _resource_version(old) != _resource_version(obj):
                self._notify("on_update", old, obj)
        self.resource_version = page["resource_version"]
        self._synced.set()

    async def _watch(self) -> int:
        """Apply one watch's events; return how many there were."""
        assert self.resource_version is not None
        self.watches += 1
        count = 0
        events = self.source.watch(
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=self.watch_timeout,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                count += 1
                self._apply(event)
        return count

    def _apply(self, event: listwatch.WatchEvent) -> None:
        raw = event["object"]
        version = _resource_version(raw)
        kind = event["type"]
        if kind == "BOOKMARK":
            pass
        elif kind in ("ADDED", "MODIFIED"):
            obj = self.projection(raw)
            old = self.store.put(obj)
            if old is None:
                self._notify("on_add", obj)
            else:
                self._notify("on_update", old, obj)
        elif kind == "DELETED":
            old = self.store.delete(stores.key_of(raw))
            self._notify("on_delete", old if old is not None else self.projection(raw))
        else:
            _log.warning("%s: unexpected watch event type %r", self.name, kind)
        if version is not None:
            self.resource_version = version

    def _notify(self, method: str, *objs: stores.RawObject) -> None:
        for handler in self._handlers:
            try:
                getattr(handler, method)(*objs)
            except Exception:
                _log.exception("%s: handler %s failed", self.name, method)
