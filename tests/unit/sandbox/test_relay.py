"""The relay's CONNECT parsing, its allow-list and its configuration file."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from kmm.sandbox import addressing, relay


def test_a_connect_request_names_its_target() -> None:
    head = b"CONNECT 10.253.0.10:10250 HTTP/1.1\r\nHost: 10.253.0.10:10250\r\n\r\n"
    assert relay.parse_connect(head) == relay.ConnectRequest("10.253.0.10", 10250)
    bracketed = relay.parse_connect(b"CONNECT [fd00::1]:443 HTTP/1.1\r\n\r\n")
    assert bracketed == relay.ConnectRequest("fd00::1", 443)


@pytest.mark.parametrize(
    ("head", "status", "says"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 405, "only CONNECT"),
        (b"CONNECT 10.253.0.10 HTTP/1.1\r\n\r\n", 400, "host:port"),
        (b"CONNECT :10250 HTTP/1.1\r\n\r\n", 400, "host:port"),
        (b"CONNECT 10.253.0.10:http HTTP/1.1\r\n\r\n", 400, "host:port"),
        (b"CONNECT 10.253.0.10:70000 HTTP/1.1\r\n\r\n", 400, "out of range"),
        (b"CONNECT 10.253.0.10:0 HTTP/1.1\r\n\r\n", 400, "out of range"),
        (b"CONNECT 10.253.0.10:10250\r\n\r\n", 400, "request line"),
        (b"CONNECT 10.253.0.10:10250 SPDY/3\r\n\r\n", 400, "request line"),
        ("CONNECT n\u00e9:1 HTTP/1.1\r\n\r\n".encode(), 400, "not ASCII"),
    ],
)
def test_a_bad_request_is_refused_with_its_status(head: bytes, status: int, says: str) -> None:
    with pytest.raises(relay.ProtocolError, match=says) as raised:
        relay.parse_connect(head)
    assert raised.value.status == status


@pytest.mark.parametrize(
    ("host", "verdict"),
    [
        (str(addressing.node_address(0)), True),
        (str(addressing.GATEWAY), True),
        ("10.245.3.7", True),  # a pod
        ("10.96.0.1", True),  # a ClusterIP
        ("127.0.0.1", False),  # the host's own loopback, seen from the fabric
        ("10.254.0.1", False),
        ("192.0.2.1", False),
        ("fd00::1", False),
        ("kmm-kubelet-0", False),  # names are never resolved
        ("localhost", False),
    ],
)
def test_only_addresses_in_the_sandboxs_networks_are_allowed(host: str, verdict: bool) -> None:
    assert relay.allowed(host, addressing.sandbox_networks()) is verdict


def test_the_configuration_survives_its_file(tmp_path: Path) -> None:
    config = relay.Config(
        health_port=1234,
        max_connections=7,
        forwarders=(
            relay.Forwarder(
                listen=relay.Endpoint("/proc/1/ns/net", str(addressing.GATEWAY), 6443),
                target=relay.Endpoint(None, "127.0.0.1", 6443),
            ),
        ),
        connect=relay.ConnectProxy(
            socket=tmp_path / "egress.sock",
            netns="/proc/2/ns/net",
            allow=(ipaddress.IPv4Network("10.253.0.0/24"),),
        ),
    )
    assert relay.load(relay.write(config, tmp_path / "relay" / "relay.json")) == config
    assert relay.argv(tmp_path / "r.json")[1:] == [
        "-m",
        "kmm.sandbox.relay",
        "--config",
        str(tmp_path / "r.json"),
    ]
