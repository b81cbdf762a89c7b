"""The token bucket on a fake clock: burst, rate, refusal past the wait."""

from __future__ import annotations

import pytest

from kmm.aio import clocks, ratelimits


def test_burst_then_rate_then_refusal() -> None:
    clock = clocks.FakeClock()
    bucket = ratelimits.TokenBucket(rate=10.0, burst=3, clock=clock)
    assert [bucket.reserve(max_wait=0.25) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(max_wait=0.25) == pytest.approx(0.1)
    assert bucket.reserve(max_wait=0.25) == pytest.approx(0.2)
    assert bucket.reserve(max_wait=0.25) is None  # 0.3 s: refused, and nothing taken
    assert bucket.reserve(max_wait=0.35) == pytest.approx(0.3)


def test_tokens_come_back_with_time_up_to_the_burst() -> None:
    clock = clocks.FakeClock()
    bucket = ratelimits.TokenBucket(rate=2.0, burst=2, clock=clock)
    assert [bucket.reserve(max_wait=0) for _ in range(3)] == [0.0, 0.0, None]
    clock.advance(0.5)  # one token back
    assert [bucket.reserve(max_wait=0) for _ in range(2)] == [0.0, None]
    clock.advance(100)  # no more than the burst is saved up
    assert [bucket.reserve(max_wait=0) for _ in range(3)] == [0.0, 0.0, None]


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        ratelimits.TokenBucket(rate=0, burst=1)
