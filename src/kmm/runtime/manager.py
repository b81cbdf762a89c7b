"""The manager: runs informers, controllers and other runnables as one unit.

Order of life, like controller-runtime's manager:
1. start every informer and every non-leader runnable (all replicas keep warm
   caches, so a new leader starts from synced stores);
2. wait until every informer has synced;
3. with a `leaderelection.LeaderElector`, wait to lead; without one, lead at once;
4. start the controllers and leader-only runnables.

It stops when `stop` is set, when any runnable fails, or when leadership is
lost. Stopping goes in reverse: leader-only work first (given `grace` seconds
to end on its own, then cancelled), then the lease is released, then the rest.
A runnable's failure is re-raised from `run`; losing the lease raises
`LeadershipLost`, because a replica that lost its lease should restart
(client-go and controller-runtime exit the process) rather than race the new
leader with stale in-flight work.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Protocol

from kmm.aio import tasks
from kmm.runtime import leaderelection

__all__ = ["LeadershipLost", "Manager", "Runnable", "Syncable", "stop_on_signals"]

_log = logging.getLogger(__name__)


class Runnable(Protocol):
    name: str

    async def run(self, stop: asyncio.Event) -> None: ...


class Syncable(Runnable, Protocol):
    def has_synced(self) -> bool: ...

    async def wait_synced(self) -> None: ...


def stop_on_signals(
    stop: asyncio.Event, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
) -> Callable[[], None]:
    """Set `stop` on SIGTERM/SIGINT (a pod's graceful shutdown); return the undo."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)

    def remove() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return remove


class LeadershipLost(Exception):
    """The lease was lost while leading: the process should exit and restart."""


class Manager:
    def __init__(
        self,
        *,
        elector: leaderelection.LeaderElector | None = None,
        grace: float = 10.0,
    ) -> None:
        self.elector = elector
        self.grace = grace
        self._informers: list[Syncable] = []
        self._always: list[Runnable] = []
        self._leader_only: list[Runnable] = []
        self.synced = asyncio.Event()
        self.started_leading = asyncio.Event()

    def add_informer(self, informer: Syncable) -> None:
        self._informers.append(informer)

    def add_controller(self, controller: Runnable) -> None:
        self._leader_only.append(controller)

    def add(self, runnable: Runnable, *, leader_only: bool = False) -> None:
        (self._leader_only if leader_only else self._always).append(runnable)

    def ready(self) -> bool:
        """For a readiness probe: caches synced."""
        return self.synced.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        base = tasks.TaskSet("manager")
        leader = tasks.TaskSet("manager/leader")
        base_stop = asyncio.Event()
        leader_stop = asyncio.Event()
        election_stop = asyncio.Event()
        lost = False
        try:
            for runnable in [*self._informers, *self._always]:
                base.spawn(runnable.run(base_stop), name=runnable.name)
            synced = base.spawn(self._wait_synced(), name="wait-synced")
            await tasks.wait_first(stop, base.failed, self.synced)
            if not synced.done():
                synced.cancel()  # it has no stop event: never leave it to the grace period
                return
            elector = self.elector
            if elector is not None:
                base.spawn(elector.run(election_stop), name="leader-election")
                await tasks.wait_first(stop, base.failed, elector.leading, elector.lost)
                if not elector.leading.is_set():
                    return
            self.started_leading.set()
            for runnable in self._leader_only:
                leader.spawn(runnable.run(leader_stop), name=runnable.name)
            waits = [stop, base.failed, leader.failed]
            if elector is not None:
                waits.append(elector.lost)
            await tasks.wait_first(*waits)
            lost = elector is not None and elector.lost.is_set() and not stop.is_set()
        finally:
            # A lost lease allows no grace: another replica may lead in
            # lease_duration - renew_deadline seconds, so stop work at once.
            lease_lost = self.elector is not None and self.elector.lost.is_set()
            leader_stop.set()
            await self._drain(leader, grace=0.0 if lease_lost else self.grace)
            election_stop.set()
            await self._drain(base, only=lambda name: name.endswith("/leader-election"))
            base_stop.set()
            await self._drain(base)
        leader.raise_failure()
        base.raise_failure()
        if lost:
            raise LeadershipLost("lost the leader election lease")

    async def _wait_synced(self) -> None:
        for informer in self._informers:
            await informer.wait_synced()
        self.synced.set()
        _log.info("manager: %d informer(s) synced", len(self._informers))

    async def _drain(
        self,
        owned: tasks.TaskSet,
        *,
        grace: float | None = None,
        only: Callable[[str], bool] | None = None,
    ) -> None:
        """Let tasks end on their stop event for `grace` seconds, then cancel."""
        pending = owned.tasks()
        if only is not None:
            pending = [task for task in pending if only(task.get_name())]
        grace = self.grace if grace is None else grace
        if pending and grace > 0:
            await asyncio.wait(pending, timeout=grace)
        if only is None:
            await owned.close()
