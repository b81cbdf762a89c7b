"""The periodic resync on a fake clock: every key, every period, as leader-only work."""

from __future__ import annotations

import asyncio

import pytest

from kmm.aio import clocks
from kmm.runtime import manager, resyncing

from . import helpers


async def test_every_key_is_requeued_once_per_period() -> None:
    clock = clocks.FakeClock()
    keys = ["ns/a", "ns/b"]
    queued: list[str] = []
    resync = resyncing.Resync("resync", lambda: list(keys), queued.append, period=600, clock=clock)
    stop = asyncio.Event()
    task = asyncio.ensure_future(resync.run(stop))
    try:
        await helpers.settle(lambda: clock.pending == 1)
        clock.advance(599)
        await asyncio.sleep(0)
        assert queued == []  # the initial list has just enqueued everything
        clock.advance(1)
        await helpers.settle(lambda: resync.resyncs == 1)
        assert queued == ["ns/a", "ns/b"]
        keys.append("ns/c")  # keys are read each round, not once
        await helpers.settle(lambda: clock.pending == 1)
        clock.advance(600)
        await helpers.settle(lambda: resync.resyncs == 2)
        assert queued == ["ns/a", "ns/b", "ns/a", "ns/b", "ns/c"]
    finally:
        stop.set()
        await task
    assert task.exception() is None


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="more than 0"):
        resyncing.Resync("resync", list, print, period=0)


class _Synced:
    name = "informer"

    def has_synced(self) -> bool:
        return True

    async def wait_synced(self) -> None:
        return None

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


async def test_a_leader_only_resync_runs_once_the_manager_leads() -> None:
    clock = clocks.FakeClock()
    queued: list[str] = []
    resync = resyncing.Resync("resync", lambda: ["k"], queued.append, period=1, clock=clock)
    mgr = manager.Manager()
    mgr.add_informer(_Synced())
    mgr.add(resync, leader_only=True)
    stop = asyncio.Event()
    task = asyncio.ensure_future(mgr.run(stop))
    try:
        await helpers.settle(lambda: mgr.started_leading.is_set() and clock.pending == 1)
        clock.advance(1)
        await helpers.settle(lambda: queued == ["k"])
    finally:
        stop.set()
        await task
