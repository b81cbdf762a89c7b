"""Lease leader election on a fake clock, with in-memory leases that enforce resourceVersion."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable

import pytest

from kmm.aio import clocks
from kmm.kube import errors
from kmm.runtime import leaderelection

from . import helpers

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def wall_of(clock: clocks.FakeClock) -> Callable[[], datetime.datetime]:
    return lambda: EPOCH + datetime.timedelta(seconds=clock.now())


def elector(
    leases: leaderelection.LeaseClient, identity: str, clock: clocks.FakeClock, **kwargs: object
) -> leaderelection.LeaderElector:
    return leaderelection.LeaderElector(
        leases,
        identity,
        namespace="ns",
        name="lock",
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=2.0,
        jitter=0.0,
        clock=clock,
        wall=wall_of(clock),
        **kwargs,  # type: ignore[arg-type]
    )


class Running:
    def __init__(self, e: leaderelection.LeaderElector) -> None:
        self.elector = e
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(e.run(self.stop))

    async def stop_and_wait(self) -> None:
        self.stop.set()
        await self.task

    async def crash(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


async def run_until(clock: clocks.FakeClock, when: float, *, step: float = 0.25) -> None:
    """Move the clock to ``when`` in steps, letting the loop run (a bounded
    number of turns) after each: whatever is due happens on its own schedule."""
    while clock.now() < when:
        clock.advance(step)
        for _ in range(100):
            await asyncio.sleep(0)


async def tick(clock: clocks.FakeClock, sleepers: int, seconds: float = 2.0) -> None:
    """Advance, then wait until ``sleepers`` timers are pending again: a
    follower's retry sleep, or a leader's retry sleep and its deadline."""
    clock.advance(seconds)
    await helpers.settle(lambda: clock.pending == sleepers)


async def test_first_candidate_creates_the_lease_and_leads() -> None:
    clock = clocks.FakeClock(100.0)
    leases = leaderelection.MemoryLeases()
    started: list[str] = []
    a = Running(elector(leases, "a", clock, on_started_leading=lambda: started.append("a")))
    await helpers.settle(a.elector.is_leader)
    record = leases.records[("ns", "lock")]
    assert record.holder == "a"
    assert record.lease_duration_seconds == 15
    assert record.lease_transitions == 0
    assert record.acquire_time == record.renew_time == wall_of(clock)()
    assert started == ["a"]
    await helpers.settle(lambda: clock.pending == 2)
    await tick(clock, 2)
    renewed = leases.records[("ns", "lock")]
    assert renewed.acquire_time == record.acquire_time
    assert renewed.renew_time == record.renew_time + datetime.timedelta(seconds=2)  # type: ignore[operator]
    assert renewed.lease_transitions == 0
    await a.stop_and_wait()


async def test_only_one_leads_and_release_hands_over_at_the_next_retry() -> None:
    clock = clocks.FakeClock()
    leases = leaderelection.MemoryLeases()
    stopped: list[str] = []
    new_leaders: list[str] = []
    a = Running(elector(leases, "a", clock, on_stopped_leading=lambda: stopped.append("a")))
    await helpers.settle(a.elector.is_leader)
    b = Running(elector(leases, "b", clock, on_new_leader=new_leaders.append))
    await helpers.settle(lambda: clock.pending == 3)
    for _ in range(10):
        await tick(clock, 3)
        assert a.elector.is_leader()
        assert not b.elector.is_leader()
    await a.stop_and_wait()
    assert stopped == ["a"]
    released = leases.records[("ns", "lock")]
    assert released.holder == ""
    assert released.lease_duration_seconds == 1
    await tick(clock, 2)
    assert b.elector.is_leader()
    taken = leases.records[("ns", "lock")]
    assert taken.holder == "b"
    assert taken.lease_transitions == 1
    assert new_leaders == ["a", "b"]
    await b.stop_and_wait()


async def test_a_crashed_leader_is_replaced_after_the_lease_duration() -> None:
    clock = clocks.FakeClock()
    leases = leaderelection.MemoryLeases()
    a = Running(elector(leases, "a", clock))
    await helpers.settle(a.elector.is_leader)
    b = Running(elector(leases, "b", clock))
    await helpers.settle(lambda: clock.pending == 3)
    await a.crash()  # no release: the lease still names "a"
    assert leases.records[("ns", "lock")].holder == "a"
    # b observed a's record at t=0; it may take over once 15 s pass unchanged.
    while clock.now() < 14.0:
        await tick(clock, 1)
        assert not b.elector.is_leader()
    await tick(clock, 2)
    assert b.elector.is_leader()
    assert clock.now() == 16.0
    assert leases.records[("ns", "lock")].lease_transitions == 1
    await b.stop_and_wait()


class Flaky(leaderelection.MemoryLeases):
    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    async def update(
        self, namespace: str, name: str, record: leaderelection.LeaseRecord
    ) -> leaderelection.LeaseRecord:
        if self.broken:
            raise errors.Unavailable(0, "connection refused")
        return await super().update(namespace, name, record)


async def test_leader_that_cannot_renew_gives_up_after_the_renew_deadline() -> None:
    clock = clocks.FakeClock()
    leases = Flaky()
    stopped: list[str] = []
    a = Running(elector(leases, "a", clock, on_stopped_leading=lambda: stopped.append("a")))
    await helpers.settle(a.elector.is_leader)
    await helpers.settle(lambda: clock.pending == 2)
    leases.broken = True
    for _ in range(4):  # t = 2, 4, 6, 8: still within the 10 s deadline
        await tick(clock, 2)
        assert a.elector.is_leader()
    clock.advance(2.0)  # t = 10: deadline reached
    await a.task
    assert not a.elector.is_leader()
    assert a.elector.lost.is_set()
    assert stopped == ["a"]


class Hanging(leaderelection.MemoryLeases):
    """Updates hang (an API server that accepts the connection and never
    answers) once ``hang`` is set; ``cancelled`` counts the ones cut off."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = False
        self.hanging = 0
        self.cancelled = 0

    async def update(
        self, namespace: str, name: str, record: leaderelection.LeaseRecord
    ) -> leaderelection.LeaseRecord:
        if self.hang:
            self.hanging += 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().update(namespace, name, record)


async def test_a_renewal_that_hangs_is_cut_off_at_the_deadline() -> None:
    clock = clocks.FakeClock()
    leases = Hanging()
    a = Running(elector(leases, "a", clock))
    await helpers.settle(a.elector.is_leader)
    leases.hang = True  # t = 2: the renewal goes out and never comes back
    await run_until(clock, 9.75)
    assert leases.hanging == 1
    assert a.elector.is_leader()
    clock.advance(0.25)  # t = 10: the deadline of the renewal sent at t = 0
    # Bounded by loop turns: the cut-off is on our clock, not a real-time timeout.
    await helpers.settle(a.task.done)
    assert not a.elector.is_leader()
    assert a.elector.lost.is_set()
    assert leases.cancelled == 1


class Slow(Flaky):
    """The next update answers ``delay`` seconds (of the clock) after it is sent."""

    def __init__(self, clock: clocks.FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.delay = 0.0

    async def update(
        self, namespace: str, name: str, record: leaderelection.LeaseRecord
    ) -> leaderelection.LeaseRecord:
        delay, self.delay = self.delay, 0.0
        await self.clock.sleep(delay)
        return await super().update(namespace, name, record)


async def test_the_deadline_runs_from_when_the_last_renewal_was_sent() -> None:
    clock = clocks.FakeClock()
    leases = Slow(clock)
    a = Running(elector(leases, "a", clock))
    await helpers.settle(a.elector.is_leader)
    leases.delay = 3.0  # the next renewal (t ~ 2) is answered 3 s after it was sent
    await run_until(clock, 6.0)
    renewed = leases.records[("ns", "lock")].renew_time
    assert renewed is not None
    sent = (renewed - EPOCH).total_seconds()
    assert 2.0 <= sent <= 3.0
    # Others count the lease from when they see that renewal (>= sent); the
    # leader stops at sent + 10, not at its answer + 10.
    leases.broken = True
    await run_until(clock, sent + 9.75)
    assert a.elector.is_leader()
    clock.advance(0.25)
    await helpers.settle(a.task.done)
    assert not a.elector.is_leader()


async def test_holds_is_the_fence_leading_and_before_the_deadline() -> None:
    clock = clocks.FakeClock()
    leases = Flaky()
    a = Running(elector(leases, "a", clock))
    assert not a.elector.holds()
    await helpers.settle(a.elector.is_leader)
    await helpers.settle(lambda: clock.pending == 2)
    assert a.elector.holds()
    leases.broken = True
    clock.advance(9.75)  # no loop turn: the elector has not noticed anything
    assert a.elector.holds()
    clock.advance(0.25)
    assert a.elector.is_leader()  # still flagged: the task has not run yet
    assert not a.elector.holds()
    await helpers.settle(a.task.done)


async def test_stale_update_conflicts() -> None:
    leases = leaderelection.MemoryLeases()
    record = leaderelection.LeaseRecord("a", 15, EPOCH, EPOCH, 0)
    created = await leases.create("ns", "lock", record)
    await leases.update("ns", "lock", created)
    with pytest.raises(errors.Conflict):
        await leases.update("ns", "lock", created)
    with pytest.raises(errors.Conflict):
        await leases.create("ns", "lock", record)


def test_timing_must_leave_room_to_stop_before_a_takeover() -> None:
    with pytest.raises(ValueError, match="lease duration"):
        leaderelection.LeaderElector(
            leaderelection.MemoryLeases(),
            "a",
            namespace="ns",
            name="lock",
            lease_duration=10.0,
            renew_deadline=10.0,
        )


def test_lease_body_round_trip() -> None:
    record = leaderelection.LeaseRecord(
        "a", 15, EPOCH, EPOCH + datetime.timedelta(microseconds=5), 3, resource_version="9"
    )
    body = leaderelection.ApiLeases._body("ns", "lock", record)
    assert body["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000005Z",
        "leaseTransitions": 3,
    }
    assert body["metadata"]["resourceVersion"] == "9"
    assert leaderelection.ApiLeases._record(body) == record
