"""Work queue: dedup, per-key exclusivity, delays, backoff, rate limit, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from kmm.aio import clocks
from kmm.runtime import workqueue


def make(
    clock: clocks.FakeClock, *, bucket: workqueue.BucketRateLimiter | None = None
) -> workqueue.WorkQueue[str]:
    return workqueue.WorkQueue(
        "test",
        clock,
        backoff=workqueue.ItemBackoff(base=1.0, max_delay=8.0),
        bucket=bucket,
    )


async def test_adds_of_a_waiting_key_are_deduplicated() -> None:
    queue = make(clocks.FakeClock())
    queue.add("a")
    queue.add("b")
    queue.add("a")
    assert len(queue) == 2
    assert await queue.get() == "a"
    assert await queue.get() == "b"
    assert len(queue) == 0


async def test_key_added_while_processing_is_handed_out_after_done() -> None:
    queue = make(clocks.FakeClock())
    queue.add("a")
    key = await queue.get()
    queue.add("a")
    queue.add("a")
    # Not handed to a second worker while the first holds it.
    assert len(queue) == 0
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "a"
    queue.done("a")
    assert len(queue) == 0


async def test_get_waits_for_an_add() -> None:
    queue = make(clocks.FakeClock())
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not getter.done()
    queue.add("x")
    assert await getter == "x"


async def test_add_after_waits_for_the_clock() -> None:
    clock = clocks.FakeClock()
    queue = make(clock)
    queue.add_after("a", 5.0)
    assert len(queue) == 0
    assert queue.delayed == 1
    clock.advance(4.9)
    assert len(queue) == 0
    clock.advance(0.1)
    assert len(queue) == 1
    assert await queue.get() == "a"


async def test_earlier_add_after_wins_and_immediate_add_supersedes() -> None:
    clock = clocks.FakeClock()
    queue = make(clock)
    queue.add_after("a", 10.0)
    queue.add_after("a", 3.0)
    queue.add_after("a", 7.0)
    clock.advance(3.0)
    assert await queue.get() == "a"
    queue.done("a")
    clock.advance(10.0)
    assert len(queue) == 0  # the superseded timers do not add it again

    queue.add_after("b", 5.0)
    queue.add("b")
    assert await queue.get() == "b"
    queue.done("b")
    clock.advance(5.0)
    assert len(queue) == 0


async def test_get_wakes_up_when_a_delayed_key_becomes_due() -> None:
    clock = clocks.FakeClock()
    queue = make(clock)
    getter = asyncio.ensure_future(queue.get())
    queue.add_after("a", 2.0)
    await asyncio.sleep(0)
    assert not getter.done()
    clock.advance(2.0)
    assert await getter == "a"


async def test_rate_limited_adds_back_off_exponentially_until_forgotten() -> None:
    clock = clocks.FakeClock()
    queue = make(clock)
    delays = []
    for _ in range(6):
        queue.add_rate_limited("a")
        start = clock.now()
        while len(queue) == 0:
            clock.advance(0.5)
        delays.append(clock.now() - start)
        assert await queue.get() == "a"
        queue.done("a")
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert queue.failures("a") == 6
    queue.forget("a")
    assert queue.failures("a") == 0


async def test_backoff_is_per_key() -> None:
    backoff: workqueue.ItemBackoff[str] = workqueue.ItemBackoff(base=1.0, max_delay=100.0)
    assert [backoff.when("a") for _ in range(3)] == [1.0, 2.0, 4.0]
    assert backoff.when("b") == 1.0


def test_token_bucket_allows_a_burst_then_paces_at_qps() -> None:
    clock = clocks.FakeClock()
    bucket = workqueue.BucketRateLimiter(clock, qps=2.0, burst=3)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.5)
    assert bucket.reserve() == pytest.approx(1.0)
    clock.advance(10.0)
    assert bucket.reserve() == 0.0


async def test_rate_limited_delay_is_the_larger_of_backoff_and_bucket() -> None:
    clock = clocks.FakeClock()
    queue = make(clock, bucket=workqueue.BucketRateLimiter(clock, qps=1.0, burst=1))
    queue.add_rate_limited("a")  # backoff 1s, bucket free
    queue.add_rate_limited("b")  # backoff 1s, bucket 1s
    queue.add_rate_limited("c")  # backoff 1s, bucket 2s
    clock.advance(1.0)
    assert len(queue) == 2
    clock.advance(1.0)
    assert len(queue) == 3


async def test_shutdown_ends_waiting_getters_and_ignores_new_keys() -> None:
    clock = clocks.FakeClock()
    queue = make(clock)
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.add_after("late", 1.0)
    queue.shutdown()
    with pytest.raises(workqueue.QueueShutDown):
        await getter
    queue.add("x")
    clock.advance(5.0)
    assert len(queue) == 0
    assert clock.pending == 0
