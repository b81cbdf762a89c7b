"""Helpers for tests that run against a sandbox: ours, and users' own.

``RunningSandbox`` is what a test needs to know about a started sandbox, and
how to inject a control-plane fault into it: ``stop`` / ``start`` /
``restart`` one component (``restarting``), or ``stopped`` for a block during
which it is down and after which it runs again, whatever the block raised
(a shared sandbox must not stay broken for the next test); ``partition``
for a relay one client reaches the API server through and can be cut off
by (``partitioning``); ``stalled_write`` to take one of the API server's
write slots, throttling everyone else on a sandbox with a low
``max_mutating_requests_inflight`` (``throttling``). ``eventually``
waits for a cluster to converge. Its bound only turns a hang into a failure
with a message; it asserts nothing about speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from kmm.kube import kubeconfigs
from kmm.sandbox import partitioning, processes, restarting, state, throttling

__all__ = ["RunningSandbox", "eventually"]


@dataclasses.dataclass(frozen=True)
class RunningSandbox:
    directory: Path
    kubeconfig: Path
    server: str
    node_names: list[str]
    kernels: tuple[str, ...]

    @classmethod
    def of(cls, record: state.SandboxState, kernels: tuple[str, ...]) -> RunningSandbox:
        """The sandbox ``cluster.up`` just started, whose nodes run ``kernels``."""
        return cls(
            directory=record.directory,
            kubeconfig=record.kubeconfig,
            server=record.server,
            node_names=record.node_names,
            kernels=kernels,
        )

    async def stop(self, component: str) -> bool:
        """Stop ``component`` (``etcd``, ``kube-apiserver``, ``scheduler`` ...);
        False if it was not running. The loop runs meanwhile: an operator on
        it keeps working while the component shuts down."""
        return await restarting.stop_async(self.directory, component)

    def kill(self, component: str) -> bool:
        """Crash ``component`` (SIGKILL, at once); False if it was not running.
        Quick enough to call from inside a test's hook, on the event loop."""
        return restarting.kill(self.directory, component)

    async def start(self, component: str, *, timeout: float = 180.0) -> processes.Process:
        """Start a stopped component on its data; return once it is healthy."""
        return await restarting.start(self.directory, component, timeout=timeout)

    async def restart(self, component: str, *, timeout: float = 180.0) -> processes.Process:
        return await restarting.restart(self.directory, component, timeout=timeout)

    @contextlib.asynccontextmanager
    async def stopped(self, component: str, *, timeout: float = 180.0) -> AsyncIterator[None]:
        """``component`` is down for the block and running again after it."""
        await self.stop(component)
        try:
            yield
        finally:
            # The block may have started it itself.
            if not restarting.running(self.directory, component):
                await self.start(component, timeout=timeout)

    def partition(self) -> partitioning.Partition:
        """A relay to this sandbox's API server a test can cut (``async with``)."""
        return partitioning.Partition(self.server)

    def stalled_write(
        self, namespace: str, *, user: str, answer_wait: float = 2.0
    ) -> AbstractAsyncContextManager[bool]:
        """One write slot held for the block by ``user`` (``throttling.stalled_write``)."""
        return throttling.stalled_write(
            kubeconfigs.load(self.kubeconfig), namespace, user=user, answer_wait=answer_wait
        )


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
