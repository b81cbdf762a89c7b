"""An answer the client leaves before its end takes its socket with it.

Against a TLS server on 127.0.0.1 that answers a watch, then stops reading,
as a server slow to answer TLS's close_notify does (the API server behind
a busy loop, or one just cut off): a connection closed the TLS way would
wait for that answer with its socket open, no longer in the client's pool,
so ``Client.close`` would leave it behind, and the garbage collector would
later find it unclosed (a ResourceWarning, an error under pytest here).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kmm.kube import client, errors, kubeconfigs
from kmm.sandbox import pki

GONE = {
    "type": "ERROR",
    "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
}
ADDED = {"type": "ADDED", "object": {"metadata": {"name": "a"}}}


class DeafServer:
    """Answers every request with a watch of one event, then reads nothing more."""

    def __init__(self, directory: Path, event: dict[str, Any]) -> None:
        self.keys = pki.create(directory, ())
        self.event = event
        self.held: list[asyncio.StreamWriter] = []
        self.answered = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def access(self) -> kubeconfigs.Access:
        return kubeconfigs.Access(
            server=f"https://127.0.0.1:{self.port}", source="test", ca_file=self.keys.ca_cert
        )

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        line = json.dumps(self.event).encode() + b"\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(line) + line + b"\r\n"
        )
        await writer.drain()
        writer.transport.pause_reading()  # the client's close_notify goes unanswered
        self.held.append(writer)
        self.answered.set()

    async def __aenter__(self) -> DeafServer:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.keys.serving_cert, self.keys.serving_key)
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0, ssl=context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self.held:
            writer.transport.abort()
        await self._server.wait_closed()


def sockets_to(port: int) -> int:
    """How many of this process's TCP sockets are connected to ``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (listdir's own descriptor)
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        if remote_port == port and fields[9] in inodes:
            count += 1
    return count


@pytest.fixture
async def gone_server(tmp_path: Path) -> AsyncIterator[DeafServer]:
    async with DeafServer(tmp_path, GONE) as server:
        yield server


@pytest.fixture
async def endless_server(tmp_path: Path) -> AsyncIterator[DeafServer]:
    async with DeafServer(tmp_path, ADDED) as server:
        yield server


async def test_a_watch_ended_by_an_error_event_closes_its_socket(
    gone_server: DeafServer,
) -> None:
    async with client.Client(gone_server.access()) as api:
        with pytest.raises(errors.Gone):
            async for _ in api.watch("/api/v1/configmaps"):
                pass
        # The watch's connection was left mid-stream: its socket is closed
        # already, without waiting for the server's close_notify.
        assert sockets_to(gone_server.port) == 0
    assert sockets_to(gone_server.port) == 0


async def test_a_watch_its_consumer_stops_closes_its_socket(endless_server: DeafServer) -> None:
    async with client.Client(endless_server.access()) as api:
        events = api.watch("/api/v1/configmaps")
        assert (await anext(events))["type"] == "ADDED"
        assert sockets_to(endless_server.port) == 1
        await events.aclose()
        assert sockets_to(endless_server.port) == 0


async def test_a_request_cancelled_mid_answer_closes_its_socket(
    endless_server: DeafServer,
) -> None:
    """A caller's timeout, or a reconcile cancelled, while the answer's body
    is still coming (here it never ends)."""
    async with client.Client(endless_server.access()) as api:
        asking = asyncio.ensure_future(api.request("GET", "/api/v1/configmaps"))
        await asyncio.wait_for(endless_server.answered.wait(), 10)
        await asyncio.sleep(0.1)  # its headers in, its body being read
        assert not asking.done()
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert sockets_to(endless_server.port) == 0
    assert sockets_to(endless_server.port) == 0
