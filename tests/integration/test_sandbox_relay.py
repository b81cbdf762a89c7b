"""The relay process across real namespaces: forwarders between the host and
namespaces, the CONNECT proxy dialling from the fabric, the allow-list, the
connection cap, half-close, and no connection left open."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import namespacing
import pytest

from kmm.sandbox import addressing, fabric, namespaces, ports, relay


class _EchoServer:
    """Answers each connection, once its writing half is shut, with
    ``name:`` and all it read, then closes it."""

    def __init__(self, listener: socket.socket, name: bytes) -> None:
        self.listener = listener
        self.name = name
        listener.listen()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()
        return host, port

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(connection,), daemon=True).start()

    def _echo(self, connection: socket.socket) -> None:
        with connection:
            try:
                received = b""
                while chunk := connection.recv(65536):
                    received += chunk
                connection.sendall(self.name + b":" + received)
            except OSError:
                return

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join()


def _exchange(connection: socket.socket, data: bytes) -> bytes:
    """Send ``data``, shut the writing half, read to EOF (half-close both ways)."""
    connection.sendall(data)
    connection.shutdown(socket.SHUT_WR)
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        body: bytes = response.read()
        return body


def _stats(port: int) -> dict[str, int]:
    document: dict[str, int] = json.loads(_get(port, "/stats"))
    return document


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _start_relay(launcher: namespacing.Launcher, config: relay.Config, name: str) -> None:
    path = relay.write(config, launcher.directory / name / "relay.json")
    process = launcher.launch(name, relay.argv(path), health_url="")

    def healthy() -> bool:
        assert process.alive(), (launcher.directory / f"{name}.log").read_text()
        try:
            return _get(config.health_port, "/healthz") == b"ok\n"
        except OSError:
            return False

    _wait(healthy, "the relay never became healthy")


class _World:
    def __init__(self, launcher: namespacing.Launcher) -> None:
        self.fab = fabric.create(launcher, launcher.directory)
        self.nodes = [namespaces.start_holder(launcher, f"node/{i}") for i in range(2)]
        for index, holder in enumerate(self.nodes):
            fabric.attach(self.fab, holder, index)
        host = socket.socket()
        host.bind((ports.HOST, 0))
        in_node = namespaces.socket_in(self.nodes[0].net_path)
        in_node.bind(("127.0.0.1", 0))
        kubelet = namespaces.socket_in(self.nodes[1].net_path)
        kubelet.bind((str(addressing.node_address(1)), 0))
        self.host = _EchoServer(host, b"host")
        self.in_node = _EchoServer(in_node, b"node0")
        self.kubelet = _EchoServer(kubelet, b"node1")

    def close(self) -> None:
        for server in (self.host, self.in_node, self.kubelet):
            server.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[namespacing.Launcher, _World]]:
    launcher = namespacing.Launcher(tmp_path)
    made: list[_World] = []
    try:
        made.append(_World(launcher))
        yield launcher, made[0]
    finally:
        launcher.stop_all()
        for each in made:
            each.close()


def _connect(path: Path, target: str) -> tuple[socket.socket, bytes]:
    """A CONNECT over the unix socket at ``path``: the socket and the response head."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(30)
    connection.connect(str(path))
    connection.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = connection.recv(1)
        assert chunk, f"the proxy closed after {head!r}"
        head += chunk
    return connection, head


def test_forwarders_and_the_connect_proxy_across_namespaces(
    world: tuple[namespacing.Launcher, _World],
) -> None:
    launcher, w = world
    health_port, from_host, from_fabric, from_node = ports.free_ports(4)
    egress = launcher.directory / "relay" / "egress.sock"
    fabric_ns = w.fab.holder.net_path
    node0_ns = w.nodes[0].net_path
    config = relay.Config(
        health_port=health_port,
        forwarders=(
            # The host's loopback to a listener on node 0's own loopback (a kubelet port).
            relay.Forwarder(
                listen=relay.Endpoint(None, ports.HOST, from_host),
                target=relay.Endpoint(node0_ns, "127.0.0.1", w.in_node.address[1]),
            ),
            # The gateway and node 0's loopback to the host's loopback (the API server).
            relay.Forwarder(
                listen=relay.Endpoint(fabric_ns, str(addressing.GATEWAY), from_fabric),
                target=relay.Endpoint(None, ports.HOST, w.host.address[1]),
            ),
            relay.Forwarder(
                listen=relay.Endpoint(node0_ns, "127.0.0.1", from_node),
                target=relay.Endpoint(None, ports.HOST, w.host.address[1]),
            ),
        ),
        connect=relay.ConnectProxy(
            socket=egress, netns=fabric_ns, allow=addressing.sandbox_networks()
        ),
    )
    _start_relay(launcher, config, "relay")

    with socket.create_connection((ports.HOST, from_host), timeout=30) as connection:
        assert _exchange(connection, b"to node 0") == b"node0:to node 0"
    for address in ((str(addressing.GATEWAY), from_fabric), ("127.0.0.1", from_node)):
        with namespaces.socket_in(node0_ns) as connection:
            connection.settimeout(30)
            connection.connect(address)
            assert _exchange(connection, b"to the host") == b"host:to the host"

    kubelet = f"{w.kubelet.address[0]}:{w.kubelet.address[1]}"
    connection, head = _connect(egress, kubelet)
    with connection:
        assert head.startswith(b"HTTP/1.1 200 ")
        assert _exchange(connection, b"logs please") == b"node1:logs please"
    for outside in (f"127.0.0.1:{w.host.address[1]}", "192.0.2.1:80", f"kmm-kubelet-0:{from_host}"):
        connection, head = _connect(egress, outside)
        with connection:
            assert head.startswith(b"HTTP/1.1 403 ")

    _wait(lambda: _stats(health_port)["open"] == 0, "relayed connections stayed open")
    stats = _stats(health_port)
    assert stats["forwarded"] == 3
    assert stats["connects"] == 1
    assert stats["connectRefused"] == 3
    log = (launcher.directory / "relay.log").read_text()
    assert f"refused CONNECT 127.0.0.1:{w.host.address[1]}" in log
    assert "refused CONNECT 192.0.2.1:80" in log


def test_connections_past_the_cap_are_closed_and_counted(
    world: tuple[namespacing.Launcher, _World],
) -> None:
    launcher, w = world
    health_port, from_host = ports.free_ports(2)
    config = relay.Config(
        health_port=health_port,
        max_connections=1,
        forwarders=(
            relay.Forwarder(
                listen=relay.Endpoint(None, ports.HOST, from_host),
                target=relay.Endpoint(w.nodes[0].net_path, "127.0.0.1", w.in_node.address[1]),
            ),
        ),
    )
    _start_relay(launcher, config, "relay")
    held = socket.create_connection((ports.HOST, from_host), timeout=30)
    with held:
        _wait(lambda: _stats(health_port)["forwarded"] == 1, "the first connection was not relayed")
        with (
            socket.create_connection((ports.HOST, from_host), timeout=30) as refused,
            contextlib.suppress(ConnectionResetError),
        ):
            assert refused.recv(1) == b""
        assert _stats(health_port)["refusedOverCapacity"] == 1
        assert _exchange(held, b"still here") == b"node0:still here"
    _wait(lambda: _stats(health_port)["open"] == 0, "the held connection stayed open")
