"""The work queue between event sources and reconcile workers (client-go's).

Guarantees:
- a key waiting in the queue is held once however often it is added (dedup);
- a key is handed to one worker at a time: added while being processed, it is
  marked dirty and queued again when that worker calls `done`;
- `add_after` delays an add; `add_rate_limited` delays it by the larger of a
  per-key exponential backoff (`base * 2**failures`, capped at `max_delay`)
  and an overall token bucket (`qps`, `burst`), like client-go's default
  controller rate limiter; `forget` resets the key's backoff.

All timing goes through `clocks.Clock`, so tests are deterministic. The
queue makes no decision about *when* to retry: that is `controllers.decide`.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

from kmm.aio import clocks

__all__ = ["BucketRateLimiter", "ItemBackoff", "QueueShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """`get` on a queue that was shut down and has nothing left to hand out."""


class ItemBackoff(Generic[K]):
    """Per-key exponential backoff: base * 2**failures, capped at max_delay."""

    def __init__(self, *, base: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base = base
        self.max_delay = max_delay
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # Exponent capped so the float never overflows on a key failing forever.
        return min(self.max_delay, self.base * 2.0 ** min(failures, 64))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class BucketRateLimiter:
    """An overall token bucket: `burst` tokens, refilled at `qps` per second."""

    def __init__(self, clock: clocks.Clock, *, qps: float = 10.0, burst: int = 100) -> None:
        self._clock = clock
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = clock.now()

    def reserve(self) -> float:
        """Take one token; return how long the caller must wait for it."""
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


class WorkQueue(Generic[K]):
    """Deduplicating, per-key exclusive, delaying, rate-limited queue."""

    def __init__(
        self,
        name: str,
        clock: clocks.Clock | None = None,
        *,
        backoff: ItemBackoff[K] | None = None,
        bucket: BucketRateLimiter | None = None,
    ) -> None:
        self.name = name
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._backoff: ItemBackoff[K] = backoff or ItemBackoff()
        self._bucket = bucket
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        # Delayed adds: (ready_at, seq, key); a key keeps only its earliest time.
        self._delayed: list[tuple[float, int, K]] = []
        self._ready_at: dict[K, float] = {}
        self._seq = itertools.count()
        self._timer: clocks.TimerHandle | None = None
        self._timer_at: float | None = None
        self._wakeup = asyncio.Event()
        self._shutting_down = False

    # -- adding -------------------------------------------------------------

    def add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._ready_at.pop(key, None)  # an immediate add supersedes a delayed one
        if key not in self._processing:
            self._queue.append(key)
            self._wakeup.set()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        if key in self._dirty:
            return  # already due now; a later add would only delay it
        ready_at = self._clock.now() + delay
        current = self._ready_at.get(key)
        if current is not None and current <= ready_at:
            return
        self._ready_at[key] = ready_at
        heapq.heappush(self._delayed, (ready_at, next(self._seq), key))
        self._arm_timer()

    def add_rate_limited(self, key: K) -> None:
        delay = self._backoff.when(key)
        if self._bucket is not None:
            delay = max(delay, self._bucket.reserve())
        self.add_after(key, delay)

    def forget(self, key: K) -> None:
        self._backoff.forget(key)

    def failures(self, key: K) -> int:
        return self._backoff.failures(key)

    # -- handing out --------------------------------------------------------

    async def get(self) -> K:
        """Wait for a key; the caller must call `done(key)` when finished."""
        while True:
            self._promote_due()
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                return key
            if self._shutting_down:
                raise QueueShutDown(self.name)
            self._wakeup.clear()
            await self._wakeup.wait()

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wakeup.set()

    def shutdown(self) -> None:
        """Stop accepting keys; waiting `get` calls end with QueueShutDown."""
        self._shutting_down = True
        self._delayed.clear()
        self._ready_at.clear()
        self._queue.clear()
        self._dirty.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wakeup.set()

    def __len__(self) -> int:
        """Keys waiting now (not delayed, not processing): the depth metric."""
        return len(self._queue)

    @property
    def delayed(self) -> int:
        return len(self._ready_at)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    # -- delays -------------------------------------------------------------

    def _promote_due(self) -> None:
        now = self._clock.now()
        while self._delayed and self._delayed[0][0] <= now:
            ready_at, _, key = heapq.heappop(self._delayed)
            # Stale heap entries (superseded by an earlier time or an add) are skipped.
            if self._ready_at.get(key) == ready_at:
                del self._ready_at[key]
                self.add(key)
        self._arm_timer()

    def _arm_timer(self) -> None:
        while self._delayed and self._ready_at.get(self._delayed[0][2]) != self._delayed[0][0]:
            heapq.heappop(self._delayed)
        if not self._delayed:
            return
        next_at = self._delayed[0][0]
        if self._timer is not None and self._timer_at is not None and self._timer_at <= next_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = next_at
        self._timer = self._clock.call_at(next_at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._promote_due()
