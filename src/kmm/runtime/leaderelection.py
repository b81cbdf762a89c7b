"""Lease-based leader election (coordination.k8s.io/v1), after client-go's.

Semantics kept from client-go's `tryAcquireOrRenew`:
- The lease is free when it has no holder, or when the holder's record has not
  changed for `lease_duration` seconds of *our* clock since we last saw it
  change (the observed time, not the lease's renewTime: we never compare
  clocks across machines).
- Taking the lease over sets `acquireTime` and bumps `leaseTransitions`;
  renewing keeps both and moves `renewTime`. Every write is an update with
  the read `resourceVersion` (optimistic concurrency: of two candidates racing
  for a free lease, exactly one update succeeds).
- A leader retries renewal every `retry_period` and gives leadership up when
  it has not renewed for `renew_deadline` (< `lease_duration`, so it stops
  acting before anyone else may take over). The deadline runs from the moment
  the last successful attempt *started*, not from its answer: a candidate
  counts the lease duration from when it saw the renewal, which is after it
  was written, which is after it was sent; a slow answer must not lend the
  leader time. A timer on our clock ends leadership at the deadline, cutting
  off an attempt in flight or the wait between two, so it ends on time even
  while the API server does not answer (client-go allows itself up to one
  `retry_period` more). `holds()` is the fence for the leader's writes: True
  only while leading and before that deadline, whenever the loop notices.
- On stop, a leader releases: empty holder, `leaseDurationSeconds: 1`, so a
  successor need not wait out the full duration.

`LeaseClient` is the seam: `ApiLeases` speaks to the API server through a
`kube.client.Client`, `MemoryLeases` keeps leases in memory with the same
resourceVersion rules for unit tests; both raise `kube.errors.Conflict` when
someone else wrote first. The elector's own clock is a `clocks.Clock`; the timestamps written
into the Lease come from `wall` (UTC), both injectable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

from kmm.aio import clocks
from kmm.kube import client, errors, objects, resources

__all__ = [
    "ApiLeases",
    "LeaderElector",
    "LeaseClient",
    "LeaseRecord",
    "MemoryLeases",
    "check_timing",
]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    holder: str
    lease_duration_seconds: int
    acquire_time: datetime.datetime | None
    renew_time: datetime.datetime | None
    lease_transitions: int
    resource_version: str = ""

    def same_record(self, other: LeaseRecord | None) -> bool:
        """Equality of what the holder wrote, ignoring the resourceVersion."""
        return other is not None and dataclasses.replace(
            self, resource_version=""
        ) == dataclasses.replace(other, resource_version="")


class LeaseClient(Protocol):
    async def get(self, namespace: str, name: str) -> LeaseRecord | None: ...

    async def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Write `record` if the lease is still at `record.resource_version`."""
        ...


def check_timing(
    lease_duration: float, renew_deadline: float, retry_period: float, *, jitter: float = 1.2
) -> None:
    """ValueError unless a leader can stop before a takeover: the renew
    deadline inside the lease, and room for a retry (with its jitter) inside it."""
    if not (lease_duration > renew_deadline > jitter * retry_period >= 0 and retry_period > 0):
        raise ValueError(
            f"need lease duration ({lease_duration:g} s) > renew deadline ({renew_deadline:g} s)"
            f" > {jitter:g} x retry period ({retry_period:g} s), and a retry period > 0"
        )


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(
        self,
        leases: LeaseClient,
        identity: str,
        *,
        namespace: str,
        name: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        jitter: float = 1.2,
        release_on_stop: bool = True,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: clocks.Clock | None = None,
        wall: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        check_timing(lease_duration, renew_deadline, retry_period, jitter=jitter)
        self.leases = leases
        self.identity = identity
        self.namespace = namespace
        self.name = name
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.jitter = jitter
        self.release_on_stop = release_on_stop
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._wall = wall
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        # Our clock's time past which we may no longer act as the leader, and
        # the timer that sets `_expired` then (armed while leading).
        self._deadline = float("-inf")
        self._deadline_timer: clocks.TimerHandle | None = None
        self._expired = asyncio.Event()
        self._reported_leader: str | None = None
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()

    def is_leader(self) -> bool:
        return self.leading.is_set()

    def holds(self) -> bool:
        """Leading, and the renew deadline of the last renewal not passed: may
        this replica still write as the leader right now? (A write fence.)"""
        return self.leading.is_set() and self._clock.now() < self._deadline

    @property
    def leader(self) -> str | None:
        """The holder we last observed (may be us)."""
        return self._observed.holder if self._observed is not None else None

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire, then renew until `stop` or until the lease is lost."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            if not await self._acquire(stopping):
                return
            self.leading.set()
            _log.info("%s: became leader of %s/%s", self.identity, self.namespace, self.name)
            if self._on_started is not None:
                self._on_started()
            await self._renew(stopping)
        finally:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
            stopping.cancel()
            await asyncio.wait({stopping})
            if self.leading.is_set():
                self.leading.clear()
                self.lost.set()
                if self._on_stopped is not None:
                    self._on_stopped()
                if stop.is_set() and self.release_on_stop:
                    await self.release()

    async def _wait(
        self, stopping: asyncio.Future[Any], seconds: float, *, until: asyncio.Event | None = None
    ) -> bool:
        """Sleep on our clock, or until ``until`` is set; True if stop came first."""
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waits: set[asyncio.Future[Any]] = {sleeper, stopping}
        if until is not None:
            waits.add(asyncio.ensure_future(until.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ours = waits - {stopping}
            for task in ours:
                task.cancel()
            await asyncio.wait(ours)
        return stopping.done()

    def _arm(self, started: float) -> None:
        """The attempt that started at ``started`` renewed the lease: move the deadline."""
        self._deadline = started + self.renew_deadline
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._expired.clear()
        self._deadline_timer = self._clock.call_at(self._deadline, self._expired.set)

    async def _acquire(self, stopping: asyncio.Future[Any]) -> bool:
        while not stopping.done():
            started = self._clock.now()
            if await self._try_acquire_or_renew():
                self._arm(started)
                return True
            # Jitter spreads candidates out so they do not all race each period.
            delay = self.retry_period * (1 + random.random() * self.jitter)
            if await self._wait(stopping, delay):
                return False
        return False

    async def _renew(self, stopping: asyncio.Future[Any]) -> None:
        while not self._expired.is_set():
            if await self._wait(stopping, self.retry_period, until=self._expired):
                return
            if self._expired.is_set():
                break
            started = self._clock.now()
            attempt = asyncio.ensure_future(self._try_acquire_or_renew())
            expiry = asyncio.ensure_future(self._expired.wait())
            try:
                await asyncio.wait({attempt, expiry}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (attempt, expiry):
                    task.cancel()
                await asyncio.wait({attempt, expiry})
            # An attempt cut off by the deadline is cancelled: not renewed.
            if not attempt.cancelled() and attempt.result():
                self._arm(started)
        _log.warning("%s: failed to renew lease within %ss", self.identity, self.renew_deadline)

    async def _try_acquire_or_renew(self) -> bool:
        try:
            # A hung API call must not outlive the renew deadline (real time: I/O).
            async with asyncio.timeout(self.renew_deadline):
                return await self._attempt()
        except (errors.ApiError, TimeoutError) as error:
            _log.info("%s: lease attempt failed: %s", self.identity, error)
            return False

    async def _attempt(self) -> bool:
        now_wall = self._wall()
        current = await self.leases.get(self.namespace, self.name)
        if current is None:
            record = LeaseRecord(
                holder=self.identity,
                lease_duration_seconds=round(self.lease_duration),
                acquire_time=now_wall,
                renew_time=now_wall,
                lease_transitions=0,
            )
            self._observe(await self.leases.create(self.namespace, self.name, record))
            return True
        if not current.same_record(self._observed):
            self._observe(current)
        else:
            self._observed = current  # same content, fresher resourceVersion
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and self._observed_at + current.lease_duration_seconds > self._clock.now():
            return False
        if current.holder == self.identity:
            acquire_time, transitions = current.acquire_time, current.lease_transitions
        else:
            acquire_time, transitions = now_wall, current.lease_transitions + 1
        record = LeaseRecord(
            holder=self.identity,
            lease_duration_seconds=round(self.lease_duration),
            acquire_time=acquire_time,
            renew_time=now_wall,
            lease_transitions=transitions,
            resource_version=current.resource_version,
        )
        self._observe(await self.leases.update(self.namespace, self.name, record))
        return True

    def _observe(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_at = self._clock.now()
        if record.holder and record.holder != self._reported_leader:
            self._reported_leader = record.holder
            if self._on_new_leader is not None:
                self._on_new_leader(record.holder)

    async def release(self) -> None:
        """Give the lease up if we still hold it (best effort)."""
        try:
            current = await self.leases.get(self.namespace, self.name)
            if current is None or current.holder != self.identity:
                return
            now_wall = self._wall()
            await self.leases.update(
                self.namespace,
                self.name,
                LeaseRecord(
                    holder="",
                    lease_duration_seconds=1,
                    acquire_time=now_wall,
                    renew_time=now_wall,
                    lease_transitions=current.lease_transitions,
                    resource_version=current.resource_version,
                ),
            )
        except errors.ApiError as error:
            _log.warning("%s: could not release lease: %s", self.identity, error)


class MemoryLeases:
    """Leases in memory with resourceVersion checks, for unit tests."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], LeaseRecord] = {}
        self._version = 0
        self.writes = 0

    async def get(self, namespace: str, name: str) -> LeaseRecord | None:
        return self.records.get((namespace, name))

    async def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        if (namespace, name) in self.records:
            raise errors.Conflict(409, f"{namespace}/{name} already exists", reason="AlreadyExists")
        return self._store(namespace, name, record)

    async def update(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        current = self.records.get((namespace, name))
        if current is None or current.resource_version != record.resource_version:
            raise errors.Conflict(409, f"{namespace}/{name} was modified")
        return self._store(namespace, name, record)

    def _store(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        self.writes += 1
        stored = dataclasses.replace(record, resource_version=str(self._version))
        self.records[(namespace, name)] = stored
        return stored


def _format_time(value: datetime.datetime | None) -> str | None:
    # MicroTime: RFC 3339 with microseconds, in UTC.
    if value is None:
        return None
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


class ApiLeases:
    """LeaseClient over the API server (coordination.k8s.io/v1), raw JSON."""

    def __init__(self, api: client.Client) -> None:
        self._api = api

    async def get(self, namespace: str, name: str) -> LeaseRecord | None:
        try:
            body = await self._api.request("GET", resources.LEASES.path(namespace, name))
        except errors.NotFound:
            return None
        return self._record(body)

    async def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        body = await self._api.request(
            "POST", resources.LEASES.path(namespace), body=self._body(namespace, name, record)
        )
        return self._record(body)

    async def update(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        body = await self._api.request(
            "PUT", resources.LEASES.path(namespace, name), body=self._body(namespace, name, record)
        )
        return self._record(body)

    @staticmethod
    def _record(body: dict[str, Any]) -> LeaseRecord:
        spec = body.get("spec") or {}
        return LeaseRecord(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse_time(spec.get("acquireTime")),
            renew_time=_parse_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=objects.resource_version(body) or "",
        )

    @staticmethod
    def _body(namespace: str, name: str, record: LeaseRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.lease_duration_seconds,
            "acquireTime": _format_time(record.acquire_time),
            "renewTime": _format_time(record.renew_time),
            "leaseTransitions": record.lease_transitions,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {k: v for k, v in spec.items() if v is not None},
        }
