"""Test helpers: yield to the event loop until a condition holds (no wall-clock waits)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def settle(predicate: Callable[[], bool], *, turns: int = 100_000) -> None:
    """Run the loop until `predicate()` is true; fail after `turns` loop turns.

    Bounded by turns, not seconds, so a slow machine cannot make it flaky; I/O
    callbacks (a test HTTP server) still run, since every turn polls the selector.
    """
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition never held: {predicate}")
