"""A token bucket: at most ``rate`` events a second, ``burst`` of them at once.

client-go's flowcontrol limiter in miniature. ``reserve(max_wait)`` takes a
token now and says how long to wait before using it, or refuses (``None``)
when that wait would exceed ``max_wait``, so a caller facing a flood can
answer at once instead of queueing without end. Time comes from a
``clocks.Clock``, so tests drive it with ``FakeClock``.
"""

from __future__ import annotations

from kmm.aio import clocks

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(self, rate: float, burst: int, *, clock: clocks.Clock | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._tokens = float(burst)
        self._updated: float | None = None

    def reserve(self, max_wait: float) -> float | None:
        """Take a token: the seconds to wait before it may be used, or None past ``max_wait``."""
        now = self._clock.now()
        if self._updated is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        wait = max(0.0, (1.0 - self._tokens) / self.rate)
        if wait > max_wait:
            return None
        self._tokens -= 1.0  # may go negative: the debt of the waits handed out
        return wait

    async def sleep(self, seconds: float) -> None:
        """Wait out a reservation, on the bucket's clock."""
        await self._clock.sleep(seconds)
