"""Guarded background tasks: a failure is always reported, never lost.

``guard`` wraps ``asyncio.create_task`` so that an exception escaping the
coroutine goes to ``on_error`` (the plugin's ``handle_error``) instead of
sitting unobserved in a task nobody awaits. Cancellation is not a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["cancel", "guard"]

logger = logging.getLogger(__name__)


def guard(
    coro: Coroutine[Any, Any, None],
    *,
    name: str,
    on_error: Callable[[BaseException, str], None],
) -> asyncio.Task[None]:
    """Start ``coro`` as a task whose failure is passed to ``on_error``."""
    task = asyncio.create_task(coro, name=name)

    def _done(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            on_error(error, f"background task {name} failed")

    task.add_done_callback(_done)
    return task


async def cancel(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel the tasks and wait until each has finished."""
    pending = [task for task in tasks if task is not None and not task.done()]
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # already reported by the done callback
            logger.debug("task %s ended with an error", task.get_name())
