"""The sandbox's relay: TCP across network namespaces, and the API server's
CONNECT proxy into them.

One relay process per sandbox (component ``relay``, ``python -m
kmm.sandbox.relay --config <sandbox>/relay/relay.json``) does two jobs:

- *forwarders*: listen on an address in one namespace (or the host's) and
  dial an address in another (or the host's), e.g. GATEWAY:P in the fabric
  and 127.0.0.1:P in each node namespace to the API server's host loopback
  port, and host 127.0.0.1:<kubelet port> to the kubelet in its namespace;
- the *CONNECT proxy* on a unix socket (a file, so the host's API server
  reaches it whatever its namespace): ``CONNECT host:port HTTP/1.1`` is
  answered ``200`` and spliced to a connection dialled from the fabric
  namespace, or ``403`` (and logged) when the destination is not an IP
  address in one of the allowed networks (``addressing.sandbox_networks()``).

Sockets are made in their namespace by a thread living there
(``namespaces.NamespaceThread``); all I/O runs on one asyncio loop. Each
relayed connection is spliced both ways with half-close: EOF from one side
becomes a write shutdown to the other, and the connection is closed when
both directions ended (or at once when either side fails). At most
``max_connections`` are open; one more is closed at once and counted.
Health (``/healthz``) and counters (``/stats``, JSON) are served over HTTP
on a host loopback port, once every listener is bound.

Limits: IPv4 only; the CONNECT target must be an IP literal (no names are
resolved); no authentication on the unix socket beyond its file mode (0600).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import http
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import namespaces

__all__ = [
    "Config",
    "ConnectProxy",
    "ConnectRequest",
    "Endpoint",
    "Forwarder",
    "ProtocolError",
    "allowed",
    "argv",
    "load",
    "main",
    "parse_connect",
    "write",
]

_LOG = logging.getLogger("kmm.sandbox.relay")
_HEADER_LIMIT: Final = 8192
_HEADER_TIMEOUT: Final = 30.0
_DIAL_TIMEOUT: Final = 10.0
_CHUNK: Final = 65536
_CLOSE_TIMEOUT: Final = 10.0
# What /stats counts besides "open" (the connections open now).
_COUNTERS: Final = (
    "forwarded",
    "forwardDialFailed",
    "connects",
    "connectRefused",
    "connectFailed",
    "refusedOverCapacity",
)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An address in a network namespace (``netns`` a ``/proc/PID/ns/net``
    path) or, when ``netns`` is None, in the host's."""

    netns: str | None
    host: str
    port: int

    def document(self) -> dict[str, Any]:
        return {"netns": self.netns, "host": self.host, "port": self.port}

    @classmethod
    def of(cls, document: dict[str, Any]) -> Endpoint:
        return cls(netns=document.get("netns"), host=document["host"], port=int(document["port"]))

    def __str__(self) -> str:
        return f"{self.host}:{self.port} in {self.netns or 'the host'}"


@dataclasses.dataclass(frozen=True)
class Forwarder:
    listen: Endpoint
    target: Endpoint


@dataclasses.dataclass(frozen=True)
class ConnectProxy:
    """The CONNECT proxy: its unix socket, where it dials from, what it may dial."""

    socket: Path
    netns: str | None
    allow: tuple[ipaddress.IPv4Network, ...]


@dataclasses.dataclass(frozen=True)
class Config:
    health_port: int
    forwarders: tuple[Forwarder, ...] = ()
    connect: ConnectProxy | None = None
    max_connections: int = 1024

    def document(self) -> dict[str, Any]:
        return {
            "health": {"host": "127.0.0.1", "port": self.health_port},
            "maxConnections": self.max_connections,
            "forwarders": [
                {"listen": f.listen.document(), "target": f.target.document()}
                for f in self.forwarders
            ],
            "connect": None
            if self.connect is None
            else {
                "socket": str(self.connect.socket),
                "netns": self.connect.netns,
                "allow": [str(network) for network in self.connect.allow],
            },
        }


def write(config: Config, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config.document(), indent=2))
    return path


def load(path: Path) -> Config:
    document = json.loads(path.read_text())
    connect = document.get("connect")
    return Config(
        health_port=int(document["health"]["port"]),
        max_connections=int(document.get("maxConnections", 1024)),
        forwarders=tuple(
            Forwarder(listen=Endpoint.of(f["listen"]), target=Endpoint.of(f["target"]))
            for f in document.get("forwarders") or ()
        ),
        connect=None
        if connect is None
        else ConnectProxy(
            socket=Path(connect["socket"]),
            netns=connect.get("netns"),
            allow=tuple(ipaddress.IPv4Network(cidr) for cidr in connect["allow"]),
        ),
    )


def argv(config_path: Path) -> list[str]:
    """How the sandbox launches the relay."""
    return [sys.executable, "-m", "kmm.sandbox.relay", "--config", str(config_path)]


class ProtocolError(ValueError):
    """A CONNECT request the proxy cannot honour, with the status to answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclasses.dataclass(frozen=True)
class ConnectRequest:
    host: str
    port: int


def parse_connect(head: bytes) -> ConnectRequest:
    """The target of an HTTP/1.1 CONNECT request head (request line and
    headers up to the blank line). ProtocolError: 405 for another method,
    400 for anything malformed."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError as err:
        raise ProtocolError(400, "the request head is not ASCII") from err
    request_line = text.split("\r\n", 1)[0]
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ProtocolError(400, f"not an HTTP/1.x request line: {request_line!r}")
    method, authority, _ = parts
    if method != "CONNECT":
        raise ProtocolError(405, f"only CONNECT is served, not {method}")
    host, colon, port_text = authority.rpartition(":")
    if not colon or not host or not port_text.isdigit():
        raise ProtocolError(400, f"CONNECT needs host:port, not {authority!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ProtocolError(400, f"port {port} is out of range")
    return ConnectRequest(host=host.removeprefix("[").removesuffix("]"), port=port)


def allowed(host: str, networks: Iterable[ipaddress.IPv4Network]) -> bool:
    """Whether ``host`` is an IPv4 literal inside one of ``networks`` (names
    are never resolved: a name could point anywhere)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


class _Relay:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stats: collections.Counter[str] = collections.Counter(dict.fromkeys(_COUNTERS, 0))
        self.open = 0
        self._threads: dict[str, namespaces.NamespaceThread] = {}
        self._writers: set[asyncio.StreamWriter] = set()

    # Sockets, in whichever namespace.

    async def _socket(self, netns: str | None) -> socket.socket:
        if netns is None:
            made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        else:
            thread = self._threads.get(netns)
            if thread is None:
                thread = self._threads[netns] = namespaces.NamespaceThread(netns)
            made = await asyncio.wrap_future(thread.socket())
        made.setblocking(False)
        return made

    async def listener(self, endpoint: Endpoint) -> socket.socket:
        made = await self._socket(endpoint.netns)
        made.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        made.bind((endpoint.host, endpoint.port))
        made.listen(128)
        return made

    async def dial(
        self, netns: str | None, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        made = await self._socket(netns)
        try:
            async with asyncio.timeout(_DIAL_TIMEOUT):
                await asyncio.get_running_loop().sock_connect(made, (host, port))
        except BaseException:
            made.close()
            raise
        return await asyncio.open_connection(sock=made, limit=_CHUNK)

    # Connections.

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if self.open >= self.config.max_connections:
            self.stats["refusedOverCapacity"] += 1
            writer.transport.abort()
            return False
        self.open += 1
        self._writers.add(writer)
        return True

    def _release(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        self.open -= 1

    async def _serve(
        self,
        writer: asyncio.StreamWriter,
        body: Callable[[], Awaitable[None]],
    ) -> None:
        if not self._admit(writer):
            return
        try:
            await body()
        except Exception:  # one connection's trouble ends that connection only
            _LOG.exception("relayed connection failed")
        finally:
            await _close(writer)
            self._release(writer)

    async def forward(
        self, forwarder: Forwarder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async def body() -> None:
            target = forwarder.target
            try:
                far_reader, far_writer = await self.dial(target.netns, target.host, target.port)
            except (OSError, TimeoutError) as err:
                self.stats["forwardDialFailed"] += 1
                _LOG.warning("could not dial %s: %s", target, err)
                return
            self.stats["forwarded"] += 1
            await _splice(reader, writer, far_reader, far_writer)

        await self._serve(writer, body)

    async def connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxy = self.config.connect
        assert proxy is not None

        async def body() -> None:
            try:
                async with asyncio.timeout(_HEADER_TIMEOUT):
                    head = await reader.readuntil(b"\r\n\r\n")
                request = parse_connect(head)
            except ProtocolError as err:
                await _answer(writer, err.status, str(err))
                return
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                await _answer(writer, 400, "incomplete or oversized request head")
                return
            if not allowed(request.host, proxy.allow):
                self.stats["connectRefused"] += 1
                _LOG.warning(
                    "refused CONNECT %s:%s: not in %s",
                    request.host,
                    request.port,
                    ", ".join(map(str, proxy.allow)),
                )
                await _answer(writer, 403, f"{request.host} is outside the sandbox's networks")
                return
            try:
                far_reader, far_writer = await self.dial(proxy.netns, request.host, request.port)
            except (OSError, TimeoutError) as err:
                self.stats["connectFailed"] += 1
                _LOG.warning("CONNECT %s:%s failed: %s", request.host, request.port, err)
                await _answer(writer, 502, f"could not connect: {err}")
                return
            self.stats["connects"] += 1
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await _splice(reader, writer, far_reader, far_writer)

        await self._serve(writer, body)

    async def health(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEADER_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode("ascii", "replace")
            if path == "/healthz":
                await _answer(writer, 200, "ok")
            elif path == "/stats":
                await _answer(
                    writer,
                    200,
                    json.dumps({"open": self.open, **self.stats}),
                    content_type="application/json",
                )
            else:
                await _answer(writer, 404, "not found")
        except (OSError, IndexError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a health client that went away or sent garbage
        except asyncio.LimitOverrunError:
            pass
        finally:
            await _close(writer)

    def close(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        for thread in self._threads.values():
            thread.close()


async def _answer(
    writer: asyncio.StreamWriter, status: int, text: str, *, content_type: str = "text/plain"
) -> None:
    body = (text + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    both: tuple[asyncio.StreamWriter, ...],
) -> None:
    """Copy until EOF, then shut the far side's writing half; on an error,
    abort both connections so the opposite direction ends too."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
    except OSError:
        for each in both:
            each.transport.abort()


async def _splice(
    near_reader: asyncio.StreamReader,
    near_writer: asyncio.StreamWriter,
    far_reader: asyncio.StreamReader,
    far_writer: asyncio.StreamWriter,
) -> None:
    both = (near_writer, far_writer)
    try:
        await asyncio.gather(
            _pipe(near_reader, far_writer, both), _pipe(far_reader, near_writer, both)
        )
    finally:
        await _close(far_writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close after what is buffered was sent; abort a peer that will not take it."""
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


async def _run(config: Config) -> None:
    relay = _Relay(config)
    servers: list[asyncio.Server] = []
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        for forwarder in config.forwarders:

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                forwarder: Forwarder = forwarder,
            ) -> None:
                await relay.forward(forwarder, reader, writer)

            listener = await relay.listener(forwarder.listen)
            servers.append(await asyncio.start_server(handle, sock=listener, limit=_CHUNK))
            _LOG.info("forwarding %s to %s", forwarder.listen, forwarder.target)
        if config.connect is not None:
            with contextlib.suppress(FileNotFoundError):
                config.connect.socket.unlink()
            config.connect.socket.parent.mkdir(parents=True, exist_ok=True)
            servers.append(
                await asyncio.start_unix_server(
                    relay.connect, path=str(config.connect.socket), limit=_HEADER_LIMIT
                )
            )
            os.chmod(config.connect.socket, 0o600)
            _LOG.info("CONNECT proxy on %s", config.connect.socket)
        servers.append(await asyncio.start_server(relay.health, "127.0.0.1", config.health_port))
        _LOG.info("health on 127.0.0.1:%s", config.health_port)
        await stopping.wait()
    finally:
        for server in servers:
            server.close()
        relay.close()
        for server in servers:
            await server.wait_closed()
        if config.connect is not None:
            with contextlib.suppress(FileNotFoundError):
                config.connect.socket.unlink()


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kmm.sandbox.relay")
    parser.add_argument("--config", type=Path, required=True)
    options = parser.parse_args(arguments)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    asyncio.run(_run(load(options.config)))


if __name__ == "__main__":
    main()
