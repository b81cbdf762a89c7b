"""Helpers for tests that run against a sandbox: ours, and users' own.

``RunningSandbox`` is what a test needs to know about a started sandbox, and
``eventually`` waits for a cluster to converge. Its bound only turns a hang
into a failure with a message; it asserts nothing about speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

__all__ = ["RunningSandbox", "eventually"]


@dataclasses.dataclass(frozen=True)
class RunningSandbox:
    directory: Path
    kubeconfig: Path
    server: str
    node_names: list[str]
    kernels: tuple[str, ...]


async def eventually(
    check: Callable[[], Awaitable[bool]],
    what: str,
    *,
    bound: float = 90.0,
    interval: float = 0.3,
) -> None:
    """Poll ``check`` until it returns True; AssertionError naming ``what`` after ``bound`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while True:
        if await check():
            return
        if loop.time() > deadline:
            raise AssertionError(f"never converged within {bound:.0f} s: {what}")
        await asyncio.sleep(interval)
