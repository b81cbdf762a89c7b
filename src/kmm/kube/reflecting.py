"""Keeping a local copy true to the API server: list, then watch, forever.

``Reflector`` runs client-go's reflector loop over a ``ListWatch`` and hands
what it learns to a ``Sink``:

1. list in pages; ``sink.replace(items, resourceVersion)`` with all of them;
2. watch from that resourceVersion with bookmarks; ``sink.apply(event)``
   for each event, moving the resourceVersion forward (bookmarks move it
   without an object);

   objects pass through ``projection`` first, page by page, so a list of
   5,000 Nodes never sits in memory unprojected;
3. a watch that ends normally (the server's timeout) resumes at once from
   the last resourceVersion; ``Gone`` (410: too old) relists at once; a
   paged list whose continue token expires (410: compaction passed the
   list's version between two pages) is made again in one request, as
   client-go's pager does (``FullListIfExpired``): paging again could meet
   the same fate each time when listing takes longer than the compaction
   interval;
   other ``ApiError``s, and watches that end without a single event, back
   off exponentially and resume (``on_retry`` hears of each error).

``relists`` counts the lists that completed, by why they were made:
``start`` (the first) and ``gone`` (after a 410: the watch, or a list's
continue token, had expired: what was missed while away is only known from
this list). Operators export it (``kmm_informer_relists_total``).

Anything that is not an ``ApiError`` is a bug in the sink or the source and
ends ``run``. The runtime's informers and the kubelet plugin's claim cache
are both a Reflector with a sink of their own.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Final, Protocol

from kmm.aio import backoff, clocks
from kmm.kube import errors, listwatch, objects

__all__ = ["GONE", "START", "Reflector", "Sink"]

_log = logging.getLogger(__name__)

# Why a relist was made (``Reflector.relists`` keys).
START: Final = "start"
GONE: Final = "gone"


class Sink(Protocol):
    def replace(self, items: list[objects.RawObject], resource_version: str) -> None: ...

    def apply(self, event: listwatch.WatchEvent) -> None: ...


class Reflector:
    def __init__(
        self,
        name: str,
        source: listwatch.ListWatch,
        sink: Sink,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        delays: backoff.Backoff | None = None,
        clock: clocks.Clock | None = None,
        on_retry: Callable[[errors.ApiError], None] | None = None,
        projection: Callable[[objects.RawObject], objects.RawObject] | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.sink = sink
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.delays = delays or backoff.Backoff(initial=0.8, maximum=30.0)
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._on_retry = on_retry
        self._project = projection or (lambda obj: obj)
        self.resource_version: str | None = None
        # Counters for tests and metrics: how often each thing happened.
        self.lists = 0
        self.watches = 0
        self.relists: collections.Counter[str] = collections.Counter()
        self._reason = START

    async def run(self) -> None:
        """List and watch until cancelled; raises only what is not an ``ApiError``."""
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                if await self._watch():
                    self.delays.reset()
                    continue
                # A watch that ends without a single event (bookmarks included)
                # is a server or proxy cutting us off: back off, do not spin.
                _log.info("%s: watch ended without events", self.name)
            except errors.Gone:
                # Relist at once: the server told us our version is too old.
                _log.info("%s: resourceVersion gone, relisting", self.name)
                self.resource_version = None
                self._reason = GONE
                continue
            except errors.ApiError as error:
                _log.warning("%s: list/watch failed: %s", self.name, error)
                if self._on_retry is not None:
                    self._on_retry(error)
            await self._clock.sleep(self.delays.next())

    async def _relist(self) -> None:
        self.lists += 1
        try:
            items, version = await self._list(self.page_size)
        except errors.Gone:
            # Only a continue token can be too old: the first page names no
            # version. Costs the memory paging saves, this once.
            _log.info("%s: continue token expired mid-list, listing in one request", self.name)
            items, version = await self._list(0)
        self.sink.replace(items, version)
        self.resource_version = version
        self.relists[self._reason] += 1

    async def _list(self, page_size: int) -> tuple[list[objects.RawObject], str]:
        """Every item (projected) and the list's resourceVersion; ``page_size`` 0: one page."""
        items: list[objects.RawObject] = []
        token: str | None = None
        while True:
            page = await self.source.list_page(
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                limit=page_size,
                continue_token=token,
            )
            items.extend(self._project(item) for item in page["items"])
            token = page["continue_token"]
            if token is None:
                return items, page["resource_version"]

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
                version = objects.resource_version(event["object"])
                if event["type"] != "BOOKMARK":
                    event = listwatch.WatchEvent(
                        type=event["type"], object=self._project(event["object"])
                    )
                self.sink.apply(event)
                if version is not None:
                    self.resource_version = version
        return count
