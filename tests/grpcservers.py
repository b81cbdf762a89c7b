"""Stopping a test's gRPC aio server without leaving its tasks behind.

grpc's aio server runs each call in tasks of its own (the handler and an
exception guard) that finish a few loop turns after the call has completed
for its client; ``server.stop`` returns without awaiting them, so a test's
leak check can find them still running (seen once in CI: the health servicer's
``Check``). Stopping gracefully lets calls finish at the core, and awaiting
the tasks that remain lets them finish in Python too.
"""

from __future__ import annotations

import asyncio

from grpc import aio

# Long enough for a finished call's tasks to settle on a loaded CI worker;
# a task still running after it is a real leak, which the leak check reports.
_SETTLE_SECONDS = 5.0


async def stop(server: aio.Server) -> None:
    """Stop ``server`` and wait for the tasks of its calls to end."""
    await server.stop(grace=_SETTLE_SECONDS)
    current = asyncio.current_task()
    grpc_tasks = {task for task in asyncio.all_tasks() if task is not current and _is_grpcs(task)}
    if grpc_tasks:
        await asyncio.wait(grpc_tasks, timeout=_SETTLE_SECONDS)


def _is_grpcs(task: asyncio.Task[object]) -> bool:
    # grpc's cython names a call's tasks "HandleExceptions[/pkg.Svc/Method]" and "rpc_task",
    # and their coroutines are cython's; the test's own tasks are Python coroutines.
    name = task.get_name()
    return (
        name == "rpc_task"
        or name.startswith("HandleExceptions[")
        or "cython" in repr(task.get_coro())
    )
