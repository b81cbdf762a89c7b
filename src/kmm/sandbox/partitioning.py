"""A network partition on demand: one client cut off the API server, then let back.

``Partition`` is a TCP relay on 127.0.0.1 in front of a sandbox's API server.
A client given ``access(...)`` (the same access, its server the relay's
address) talks to the real server through it, TLS end to end: the relay
moves bytes and sees nothing else, and the server's certificate names
127.0.0.1 whatever the port. ``cut()`` aborts every connection it relays
and closes new ones as soon as they are accepted, until ``heal()``: that
client's watches break and its requests fail as in a partition, while
everyone else (the test's admin, the controllers) keeps using the server.
A watch the client resumes afterwards from its old resourceVersion meets
whatever happened meanwhile, compaction included (410 Gone).

Not a model of the network: no latency, no loss, no reordering; only
"connected" or "not". ``restarting`` is the other fault tool, for the
server's own side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import urllib.parse
from types import TracebackType

from kmm.aio import tasks
from kmm.kube import kubeconfigs

__all__ = ["Partition"]

_CHUNK = 64 * 1024


class Partition:
    """Relay to ``upstream`` (an ``https://host:port`` URL); use ``async with``."""

    def __init__(self, upstream: str) -> None:
        found = urllib.parse.urlsplit(upstream)
        if found.hostname is None or found.port is None:
            raise ValueError(f"not a host:port URL: {upstream}")
        self._upstream = (found.hostname, found.port)
        self._scheme = found.scheme
        self._server: asyncio.Server | None = None
        self._relays = tasks.TaskSet("partition")
        self._open: set[asyncio.StreamWriter] = set()
        self.cut_off = False
        # For the record: connections relayed and connections refused.
        self.relayed = 0
        self.refused = 0

    @property
    def server(self) -> str:
        """The relay's URL, to use in place of the API server's."""
        if self._server is None:
            raise RuntimeError("the partition relay is not running")
        port = self._server.sockets[0].getsockname()[1]
        return f"{self._scheme}://127.0.0.1:{port}"

    def access(self, base: kubeconfigs.Access) -> kubeconfigs.Access:
        """``base`` (the sandbox's access) through the relay."""
        return dataclasses.replace(base, server=self.server)

    def cut(self) -> None:
        """Abort every relayed connection; refuse new ones until ``heal``."""
        self.cut_off = True
        for writer in list(self._open):
            writer.transport.abort()

    def heal(self) -> None:
        self.cut_off = False

    async def __aenter__(self) -> Partition:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.cut()
        await self._relays.close()
        if server is not None:
            await server.wait_closed()
        self._relays.raise_failure()

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off or self._server is None:
            self.refused += 1
            writer.transport.abort()
            return
        self.relayed += 1
        self._relays.spawn(self._relay(reader, writer), name=f"relay-{self.relayed}")

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            except OSError:
                return  # the server is down: the client sees its connection closed
            self._open.add(up_writer)
            pipes = tasks.TaskSet("partition/pipes")
            try:
                both = {
                    pipes.spawn(_pipe(reader, up_writer), name="up"),
                    pipes.spawn(_pipe(up_reader, writer), name="down"),
                }
                # The first direction to end (EOF, reset, abort) ends both.
                await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._open.discard(up_writer)
                up_writer.transport.abort()
                await pipes.close()
        finally:
            self._open.discard(writer)
            writer.transport.abort()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
