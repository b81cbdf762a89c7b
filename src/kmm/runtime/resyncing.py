"""The periodic resync: every so often, every primary key goes back in the queue.

Level-based healing, controller-runtime's ``SyncPeriod``: an event that never
reached the queue (a handler that raised, a watch gap the reflector did not
notice) is at most one period from being reconciled anyway. A reconcile of
a converged object writes nothing, so the cost of a resync is the
reconciles, not API writes. It runs only on the leader (the manager starts
it with the controllers) and reads the keys from the informer's store, so
it never lists from the API server. The first resync comes one period
after the start: the initial list has just enqueued everything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kmm.aio import clocks, tasks

__all__ = ["Resync"]

_log = logging.getLogger(__name__)


class Resync:
    """Call ``enqueue`` with every key ``keys`` returns, every ``period`` seconds."""

    def __init__(
        self,
        name: str,
        keys: Callable[[], Iterable[str]],
        enqueue: Callable[[str], None],
        *,
        period: float,
        clock: clocks.Clock | None = None,
    ) -> None:
        if not period > 0:
            raise ValueError(f"a resync period must be more than 0 seconds, not {period}")
        self.name = name
        self.period = period
        self._keys = keys
        self._enqueue = enqueue
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self.resyncs = 0  # rounds done, for tests and describe()

    def resync(self) -> int:
        """One round now; returns how many keys were enqueued."""
        count = 0
        for key in self._keys():
            self._enqueue(key)
            count += 1
        self.resyncs += 1
        _log.debug("%s: requeued %d key(s)", self.name, count)
        return count

    async def run(self, stop: asyncio.Event) -> None:
        await tasks.run_until(stop, self._loop(), name=self.name)

    async def _loop(self) -> None:
        while True:
            await self._clock.sleep(self.period)
            self.resync()
