"""Test-wide rules: warnings are errors (pyproject) and no test may leave
asyncio tasks running behind it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def _async_leak_check() -> AsyncIterator[None]:
    yield
    # One turn of the loop lets tasks that were just cancelled or finished settle.
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leaked = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
    for task in leaked:
        task.cancel()
    if leaked:
        names = ", ".join(sorted(task.get_name() + ":" + repr(task.get_coro()) for task in leaked))
        pytest.fail(f"test left {len(leaked)} asyncio task(s) running: {names}")


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves tasks running; sync tests own no loop."""
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_async_leak_check")
