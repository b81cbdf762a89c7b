"""Manager: sync before controllers, leader gating, stop and failure propagation."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kmm.aio import clocks
from kmm.kube import errors
from kmm.runtime import leaderelection, manager

from . import helpers


class FakeInformer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.synced = asyncio.Event()
        self.stopped = False

    def has_synced(self) -> bool:
        return self.synced.is_set()

    async def wait_synced(self) -> None:
        await self.synced.wait()

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopped = True


class FakeController:
    def __init__(self, name: str, *, fail: asyncio.Event | None = None) -> None:
        self.name = name
        self.started = asyncio.Event()
        self.stopped = False
        self.ended = False
        self.fail = fail

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        try:
            if self.fail is not None:
                await self.fail.wait()
                raise RuntimeError("controller broke")
            await stop.wait()
            self.stopped = True
        finally:
            self.ended = True


async def test_controllers_start_after_every_informer_synced_and_stop_first() -> None:
    mgr = manager.Manager()
    one, two = FakeInformer("one"), FakeInformer("two")
    controller = FakeController("c")
    mgr.add_informer(one)
    mgr.add_informer(two)
    mgr.add_controller(controller)
    stop = asyncio.Event()
    run = asyncio.ensure_future(mgr.run(stop))
    one.synced.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not controller.started.is_set()
    assert not mgr.ready()
    two.synced.set()
    await controller.started.wait()
    assert mgr.ready()
    stop.set()
    await run
    assert controller.stopped
    assert one.stopped
    assert two.stopped


async def test_a_failing_runnable_stops_everything_and_is_raised() -> None:
    mgr = manager.Manager()
    informer = FakeInformer("i")
    informer.synced.set()
    fail = asyncio.Event()
    broken = FakeController("broken", fail=fail)
    healthy = FakeController("healthy")
    mgr.add_informer(informer)
    mgr.add_controller(broken)
    mgr.add_controller(healthy)
    run = asyncio.ensure_future(mgr.run(asyncio.Event()))
    await healthy.started.wait()
    fail.set()
    with pytest.raises(RuntimeError, match="controller broke"):
        await run
    assert healthy.stopped
    assert informer.stopped


async def test_stop_before_sync_starts_no_controller() -> None:
    mgr = manager.Manager()
    mgr.add_informer(FakeInformer("never-synced"))
    controller = FakeController("c")
    mgr.add_controller(controller)
    stop = asyncio.Event()
    run = asyncio.ensure_future(mgr.run(stop))
    await asyncio.sleep(0)
    stop.set()
    await run
    assert not controller.started.is_set()


def make_elector(
    leases: leaderelection.LeaseClient, identity: str, clock: clocks.FakeClock
) -> leaderelection.LeaderElector:
    return leaderelection.LeaderElector(
        leases,
        identity,
        namespace="ns",
        name="lock",
        retry_period=2.0,
        jitter=0.0,
        clock=clock,
    )


async def test_controllers_run_only_while_leading_and_stop_releases_the_lease() -> None:
    clock = clocks.FakeClock()
    leases = leaderelection.MemoryLeases()
    holder = make_elector(leases, "other", clock)
    holder_stop = asyncio.Event()
    holder_run = asyncio.ensure_future(holder.run(holder_stop))
    await helpers.settle(holder.is_leader)

    mgr = manager.Manager(elector=make_elector(leases, "me", clock))
    informer = FakeInformer("i")
    informer.synced.set()
    controller = FakeController("c")
    mgr.add_informer(informer)
    mgr.add_controller(controller)
    stop = asyncio.Event()
    run = asyncio.ensure_future(mgr.run(stop))
    # The holder's retry sleep and lease deadline, our retry sleep.
    await helpers.settle(lambda: clock.pending == 3)
    assert not controller.started.is_set()
    assert informer.has_synced()

    holder_stop.set()  # releases the lease
    await holder_run
    clock.advance(2.0)
    await controller.started.wait()
    assert leases.records[("ns", "lock")].holder == "me"
    stop.set()
    await run
    assert controller.stopped
    assert leases.records[("ns", "lock")].holder == ""


class Breakable(leaderelection.MemoryLeases):
    broken = False

    async def get(self, namespace: str, name: str) -> leaderelection.LeaseRecord | None:
        if self.broken:
            raise errors.Unavailable(0, "apiserver unreachable")
        return await super().get(namespace, name)


async def test_losing_the_lease_stops_controllers_and_raises() -> None:
    clock = clocks.FakeClock()
    leases = Breakable()
    mgr = manager.Manager(elector=make_elector(leases, "me", clock))
    informer = FakeInformer("i")
    informer.synced.set()
    controller = FakeController("c")
    mgr.add_informer(informer)
    mgr.add_controller(controller)
    run = asyncio.ensure_future(mgr.run(asyncio.Event()))
    await controller.started.wait()
    leases.broken = True
    for _ in range(6):
        await helpers.settle(lambda: clock.pending == 2 or run.done())
        clock.advance(2.0)
    with pytest.raises(manager.LeadershipLost):
        await run
    assert controller.ended  # cancelled, not asked: a lost lease allows no grace
    assert informer.stopped


async def test_a_signal_sets_stop() -> None:
    stop = asyncio.Event()
    remove = manager.stop_on_signals(stop, (signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        await stop.wait()
    finally:
        remove()


class Stubborn:
    """A leader-only runnable that ignores its stop event."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_a_lost_lease_cancels_leader_work_without_grace() -> None:
    clock = clocks.FakeClock()
    leases = Breakable()
    # A grace period this test would notice (it would hang for an hour).
    mgr = manager.Manager(elector=make_elector(leases, "me", clock), grace=3600.0)
    informer = FakeInformer("i")
    informer.synced.set()
    stubborn = Stubborn()
    mgr.add_informer(informer)
    mgr.add(stubborn, leader_only=True)
    run = asyncio.ensure_future(mgr.run(asyncio.Event()))
    await stubborn.started.wait()
    leases.broken = True
    for _ in range(6):
        await helpers.settle(lambda: clock.pending == 2 or run.done())
        clock.advance(2.0)
    with pytest.raises(manager.LeadershipLost):
        await run
    assert stubborn.cancelled
