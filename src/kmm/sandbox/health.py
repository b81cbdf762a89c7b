"""Wait for a component's health endpoint, failing fast if the process dies."""

from __future__ import annotations

import asyncio
import ssl
import time

import aiohttp

from kmm.sandbox import errors, processes

__all__ = ["wait_healthy"]


async def wait_healthy(
    process: processes.Process,
    *,
    timeout: float,
    ssl_context: ssl.SSLContext | bool = True,
) -> None:
    """Poll the process's health URL until it answers 200; raise ComponentFailed
    if the process exits first or the endpoint stays unhealthy past ``timeout``."""
    url = process.health_url
    deadline = time.monotonic() + timeout
    last_problem = "no answer yet"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            if not process.alive():
                raise errors.ComponentFailed(
                    process.name,
                    "exited during start",
                    process.log,
                    processes.log_tail(process.log),
                )
            try:
                async with session.get(url, ssl=ssl_context) as response:
                    if response.status == 200:
                        return
                    last_problem = f"HTTP {response.status}: {(await response.text())[:200]}"
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                last_problem = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                raise errors.ComponentFailed(
                    process.name,
                    f"did not become healthy within {timeout:.0f} s at {url} ({last_problem})",
                    process.log,
                    processes.log_tail(process.log),
                )
            await asyncio.sleep(0.2)
