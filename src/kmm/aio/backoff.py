"""Exponential backoff: the one retry-delay policy of kmm's loops.

``Backoff`` gives ``initial``, then doubles (``factor``) up to ``maximum``;
``reset`` after a success starts again. With ``jitter`` j each delay is
scaled by a random factor in ``[1 - j, 1]``, so many clients retrying the
same outage spread out; ``jitter=0`` gives exact delays for tests.
"""

from __future__ import annotations

import dataclasses
import random

__all__ = ["Backoff"]


@dataclasses.dataclass
class Backoff:
    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5
    attempts: int = 0

    def next(self) -> float:
        """The delay before the next attempt; each call moves one step."""
        delay = min(self.maximum, self.initial * self.factor ** min(self.attempts, 64))
        self.attempts += 1
        return delay * (1 - self.jitter * random.random())

    def reset(self) -> None:
        self.attempts = 0
