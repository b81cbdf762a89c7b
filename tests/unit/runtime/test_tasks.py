"""Guarded tasks: failures recorded, everything cancelled and awaited on close."""

from __future__ import annotations

import asyncio

import pytest

from kmm.aio import tasks


async def test_failure_is_recorded_and_reraised_by_the_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owned = tasks.TaskSet("owner")

    async def boom() -> None:
        raise ValueError("boom")

    owned.spawn(boom(), name="boom")
    await owned.failed.wait()
    assert isinstance(owned.failure, ValueError)
    assert "owner/boom" in caplog.text
    with pytest.raises(ValueError, match="boom"):
        owned.raise_failure()
    await owned.close()


async def test_close_cancels_and_awaits_every_task() -> None:
    owned = tasks.TaskSet("owner")
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    owned.spawn(forever("a"), name="a")
    owned.spawn(forever("b"), name="b")
    await asyncio.sleep(0)
    await owned.close()
    assert sorted(cleaned) == ["a", "b"]
    assert len(owned) == 0
    assert owned.failure is None


async def test_run_until_cancels_on_stop_and_reraises_failures() -> None:
    stop = asyncio.Event()
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    runner = asyncio.ensure_future(tasks.run_until(stop, work(), name="w"))
    await started.wait()
    stop.set()
    await runner

    async def broken() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await tasks.run_until(asyncio.Event(), broken(), name="b")


async def test_wait_first() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    waiter = asyncio.ensure_future(tasks.wait_first(a, b))
    await asyncio.sleep(0)
    b.set()
    await waiter
