"""Which addresses a guarded registry client dials: the rule, the resolver
that applies it to what a name resolves to, and the client refusing before
any byte is sent (servers on loopback count what reaches them)."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kmm.oci import destinations, errors
from kmm.oci.client import Client


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # every cloud's instance metadata
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%2", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("::127.0.0.1", "loopback"),
        ("::10.0.0.1", "IPv4-compatible IPv6"),
        ("fd00:ec2::254", "cloud metadata"),
        ("10.0.0.1", None),
        ("172.16.3.4", None),
        ("192.168.1.10", None),
        ("10.253.0.1", None),  # the sandbox registry's gateway address
        ("8.8.8.8", None),
        ("::ffff:10.0.0.1", None),
        ("64:ff9b::808:808", None),
        ("2001:db8::1", None),
        ("fd12:3456::1", None),
    ],
)
def test_the_rule(address: str, reason: str | None) -> None:
    assert destinations.refusal(ipaddress.ip_address(address)) == reason


def test_configured_endpoints_are_trusted_pairs() -> None:
    trusted = destinations.trusted_pairs(["127.0.0.1:5000", "localhost", "[::1]:5001"])
    guard = destinations.Guard(trusted)
    guard.check_literal("127.0.0.1", 5000)
    guard.check_literal("::1", 5001)
    assert guard.is_trusted("LOCALHOST", 443)
    with pytest.raises(destinations.Refused, match="loopback"):
        guard.check_literal("127.0.0.1", 5001)
    guard.check_literal("registry.example", 443)  # a name: judged once resolved


async def test_the_resolver_keeps_only_allowed_addresses() -> None:
    resolver = destinations.Guard().resolver()
    try:
        with pytest.raises(destinations.Refused, match="loopback"):
            await resolver.resolve("localhost", 5000)
    finally:
        await resolver.close()
    trusting = destinations.Guard(destinations.trusted_pairs(["localhost:5000"])).resolver()
    try:
        found = await trusting.resolve("localhost", 5000)
        assert {r["host"] for r in found} <= {"127.0.0.1", "::1"}
        assert found
    finally:
        await trusting.close()


@pytest.fixture
async def counted() -> AsyncIterator[tuple[list[str], int]]:
    """A registry on loopback answering every manifest with 200; the paths asked."""
    asked: list[str] = []

    async def manifest(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(
            headers={
                "Content-Type": "application/vnd.oci.image.manifest.v1+json",
                "Docker-Content-Digest": "sha256:" + "a" * 64,
            }
        )

    app = web.Application()
    app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", manifest)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield asked, server.port
    finally:
        await server.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_guarded_client_never_dials_loopback(
    counted: tuple[list[str], int], host: str
) -> None:
    asked, port = counted
    guarded = Client(f"{host}:{port}", plain_http=True, guard=destinations.Guard())
    async with guarded:
        with pytest.raises(errors.DestinationRefused, match="loopback") as refused:
            await guarded.exists("kmm/mod", "v1")
    assert asked == []
    assert str(port) in refused.value.public or host in refused.value.public
    # The operator's own endpoint for a host is dialled as configured.
    endpoint = f"127.0.0.1:{port}"
    trusting = destinations.Guard(destinations.trusted_pairs([endpoint]))
    async with Client(
        "registry.test:5000", plain_http=True, endpoint=endpoint, guard=trusting
    ) as ok:
        assert await ok.exists("kmm/mod", "v1") is not None
    assert asked == ["/v2/kmm/mod/manifests/v1"]
