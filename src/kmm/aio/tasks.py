"""Guarded background tasks: no task outlives its owner, no failure goes unseen.

`TaskSet` replaces bare `asyncio.create_task`: every task is named, a task
that fails is logged and recorded (`failure`, `failed`) so the owner can stop,
passed to the owner's `on_error` if it gave one, and `close()` cancels and
awaits all of them. The manager and every runnable that starts helpers own
one `TaskSet` and close it in a `finally`. `guard` and `cancel` are the same
for one task whose owner keeps a handle on it (the kubelet plugin's
publisher): its failure goes to `on_error`, never into a task nobody awaits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ErrorHandler", "TaskSet", "cancel", "guard", "run_until", "wait_first"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Told of a background failure: the error and what failed.
ErrorHandler = Callable[[BaseException, str], None]


class TaskSet:
    """Named tasks owned by one owner; the first failure is kept for it."""

    def __init__(self, owner: str, *, on_error: ErrorHandler | None = None) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None
        self._closing = False
        self._on_error = on_error

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        if self._closing:
            coro.close()
            raise RuntimeError(f"{self.owner}: cannot start {name!r} while closing")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}/{name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        _log.error("task %s failed", task.get_name(), exc_info=error)
        if self.failure is None:
            self.failure = error
        self.failed.set()
        if self._on_error is not None:
            self._on_error(error, f"background task {task.get_name()} failed")

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks)

    async def close(self) -> None:
        """Cancel every task and wait until all have ended."""
        self._closing = True
        try:
            while self._tasks:
                pending = list(self._tasks)
                for task in pending:
                    task.cancel()
                # asyncio.wait never raises a task's error: _finished recorded it.
                await asyncio.wait(pending)
        finally:
            self._closing = False

    def raise_failure(self) -> None:
        """Re-raise the first failure in the owner's context, if any."""
        if self.failure is not None:
            raise self.failure


async def run_until(stop: asyncio.Event, coro: Coroutine[Any, Any, None], *, name: str) -> None:
    """Run `coro` until it ends or `stop` is set (then cancel it); re-raise its failure.

    The usual body of a runnable's `run(stop)` whose work blocks on I/O.
    """
    owned = TaskSet(name)
    work = owned.spawn(coro, name="main")
    stopped = owned.spawn(stop.wait(), name="stop")
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await owned.close()
    if not work.cancelled() and work.exception() is not None:
        raise work.exception()  # type: ignore[misc]


async def wait_first(*events: asyncio.Event) -> None:
    """Return as soon as any of `events` is set."""
    if any(event.is_set() for event in events):
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.wait(waiters)


def guard(
    coro: Coroutine[Any, Any, None], *, name: str, on_error: ErrorHandler
) -> asyncio.Task[None]:
    """Start ``coro`` as a task whose failure is passed to ``on_error``."""
    task = asyncio.get_running_loop().create_task(coro, name=name)

    def finished(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            on_error(error, f"background task {name} failed")

    task.add_done_callback(finished)
    return task


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel the tasks and wait until each has ended (failures were reported)."""
    pending = [task for task in tasks if task is not None and not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
