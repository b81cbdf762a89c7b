"""Redirects, realms and what an error tells, for a guarded client.

The registry and the hosts it sends the client to are doubles on loopback,
reached as the operator's configured endpoints (the guard trusts those
(host, port) pairs; any other loopback address is refused, which is how a
redirect to a refused destination is shown here). Each double counts what
reaches it, and what Authorization it was sent."""

from __future__ import annotations

import base64
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kmm.oci import auth, destinations, errors
from kmm.oci.client import Client
from kmm.oci.transport import MAX_REDIRECTS
from kmm.sandbox import pki

_DIGEST = "sha256:" + "d" * 64
_CREDENTIALS = auth.Credentials("robot", "s3cret")
_BASIC = "Basic " + base64.b64encode(b"robot:s3cret").decode()
_SECRET_TEXT = "internal detail: db at 10.9.8.7"


@dataclasses.dataclass
class _Double:
    """One HTTP server: ``answer`` decides each request's response."""

    seen: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # method, path, auth
    location: str = ""  # where manifests redirect to ("" = answer them)
    status: int = 307
    basic: bool = False  # wants _BASIC
    realm: str = ""  # wants a Bearer token from this realm
    failing: int = 0  # answer manifests with this status and a telling body
    port: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        self.seen.append((request.method, request.path_qs, header))
        if request.path == "/token":
            return web.json_response({"token": "t0k"})
        if self.realm and header != "Bearer t0k":
            challenge = f'Bearer realm="{self.realm}",service="double"'
            return web.Response(status=401, headers={"WWW-Authenticate": challenge})
        if self.basic and header != _BASIC:
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        if self.failing:
            body = f'{{"errors": [{{"code": "NOT_A_SPEC_CODE", "message": "{_SECRET_TEXT}"}}]}}'
            return web.Response(status=self.failing, text=body, content_type="application/json")
        if self.location:
            return web.Response(status=self.status, headers={"Location": self.location})
        return web.Response(
            headers={
                "Content-Type": "application/vnd.oci.image.manifest.v1+json",
                "Docker-Content-Digest": _DIGEST,
            }
        )


async def _serve(
    double: _Double, host: str = "127.0.0.1", context: ssl.SSLContext | None = None
) -> TestServer:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", double.handle)
    server = TestServer(app, host=host)
    await server.start_server(ssl=context)
    double.port = server.port or 0
    return server


@pytest.fixture
async def pair() -> AsyncIterator[tuple[_Double, _Double]]:
    """The registry (wants Basic) and another host, both trusted endpoints."""
    registry, other = _Double(basic=True), _Double()
    servers = [await _serve(registry), await _serve(other)]
    try:
        yield registry, other
    finally:
        for server in servers:
            await server.close()


def _client(registry: _Double, *trusted: str, insecure: bool = False) -> Client:
    endpoint = f"127.0.0.1:{registry.port}"
    return Client(
        "registry.test:5000",
        credentials=_CREDENTIALS,
        plain_http=True,
        insecure=insecure,
        endpoint=endpoint,
        guard=destinations.Guard(destinations.trusted_pairs([endpoint, *trusted])),
    )


async def test_a_redirect_to_another_host_is_followed_without_credentials(
    pair: tuple[_Double, _Double],
) -> None:
    registry, other = pair
    registry.location = f"http://127.0.0.1:{other.port}/blobs/x?sig=1"
    async with _client(registry, f"127.0.0.1:{other.port}") as client:
        found = await client.head_manifest("kmm/mod", "v1")
        assert found.digest == _DIGEST
        assert (await client.get_manifest("kmm/mod", "v1"))[0].digest == _DIGEST
    # The registry got its credentials; the other host never saw them.
    assert [a for _, _, a in registry.seen] == ["", _BASIC, _BASIC]
    assert other.seen == [("HEAD", "/blobs/x?sig=1", ""), ("GET", "/blobs/x?sig=1", "")]


async def test_a_relative_redirect_stays_on_the_registry_with_its_credentials(
    pair: tuple[_Double, _Double],
) -> None:
    registry, _ = pair
    async with _client(registry) as client:
        registry.location = "/v2/kmm/mod/manifests/moved"
        registry.status = 308
        with pytest.raises(errors.UnexpectedResponse, match=f"more than {MAX_REDIRECTS}"):
            await client.head_manifest("kmm/mod", "v1")
    # The challenge, the answered request, then each hop, always authenticated.
    hops = registry.seen[2:]
    assert len(hops) == MAX_REDIRECTS
    assert all(a == _BASIC and p == "/v2/kmm/mod/manifests/moved" for _, p, a in hops)


async def test_a_redirect_to_an_address_not_dialled_is_refused(
    pair: tuple[_Double, _Double],
) -> None:
    registry, _ = pair
    elsewhere = _Double()
    server = await _serve(elsewhere, host="127.0.0.2")  # loopback, not configured
    try:
        registry.location = f"http://127.0.0.2:{elsewhere.port}/meta-data/"
        async with _client(registry) as client:
            with pytest.raises(errors.DestinationRefused, match="loopback") as refused:
                await client.exists("kmm/mod", "v1")
        assert elsewhere.seen == []
        assert "127.0.0.2" not in refused.value.public
    finally:
        await server.close()


async def test_another_hosts_challenge_is_never_answered(pair: tuple[_Double, _Double]) -> None:
    registry, other = pair
    other.realm = f"http://127.0.0.1:{other.port}/token"
    registry.location = f"http://127.0.0.1:{other.port}/blobs/x"
    async with _client(registry, f"127.0.0.1:{other.port}", insecure=True) as client:
        with pytest.raises(errors.UnexpectedResponse, match="redirected to answered 401"):
            await client.exists("kmm/mod", "v1")
    assert [p for _, p, _ in other.seen] == ["/blobs/x"]  # no token asked with our credentials


async def test_an_error_tells_a_tenant_its_class_and_status_only(
    pair: tuple[_Double, _Double],
) -> None:
    registry, _ = pair
    registry.failing = 500
    async with _client(registry) as client:
        with pytest.raises(errors.UnexpectedResponse) as failed:
            await client.exists("kmm/mod", "v1")
    assert failed.value.public == "HEAD /v2/kmm/mod/manifests/v1: registry.test:5000 answered 500"
    # A GET has a body: still not in the public text, only in the log's.
    async with _client(registry) as client:
        with pytest.raises(errors.UnexpectedResponse) as failed:
            await client.get_manifest("kmm/mod", "v1")
    assert _SECRET_TEXT not in failed.value.public
    assert "NOT_A_SPEC_CODE" not in failed.value.public
    assert _SECRET_TEXT in str(failed.value)
    assert failed.value.status == 500


async def test_no_answer_names_no_socket_error() -> None:
    closed = _Double()
    server = await _serve(closed)
    port = closed.port
    await server.close()  # nothing listens there now
    endpoint = f"127.0.0.1:{port}"
    guard = destinations.Guard(destinations.trusted_pairs([endpoint]))
    async with Client(
        "registry.test:5000", plain_http=True, endpoint=endpoint, guard=guard
    ) as client:
        with pytest.raises(errors.Unreachable) as failed:
            await client.exists("kmm/mod", "v1")
    assert failed.value.public == "HEAD /v2/kmm/mod/manifests/v1: no answer from registry.test:5000"
    assert "refused" in str(failed.value).lower() or str(port) in str(failed.value)


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.create(tmp_path_factory.mktemp("pki"), ())


def _tls(authority: pki.Pki) -> ssl.SSLContext:
    cert, key = pki.issue_serving(
        authority, "registry", "registry", dns_names=("registry.test",), ips=()
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def _https_client(registry: _Double, ca: Path, *trusted: str, insecure: bool) -> Client:
    endpoint = f"127.0.0.1:{registry.port}"
    return Client(
        "registry.test:5000",
        credentials=_CREDENTIALS,
        ca_files=(ca,),
        insecure=insecure,
        endpoint=endpoint,
        guard=destinations.Guard(destinations.trusted_pairs([endpoint, *trusted])),
    )


@pytest.mark.parametrize("insecure", [False, True])
async def test_plain_http_realms_and_redirects_only_for_an_insecure_registry(
    authority: pki.Pki, insecure: bool
) -> None:
    token = _Double()
    registry = _Double()
    servers = [await _serve(token), await _serve(registry, context=_tls(authority))]
    trusted = f"127.0.0.1:{token.port}"
    try:
        registry.realm = f"http://127.0.0.1:{token.port}/token"
        async with _https_client(registry, authority.ca_cert, trusted, insecure=insecure) as client:
            if insecure:
                assert await client.exists("kmm/mod", "v1") is not None
            else:
                with pytest.raises(errors.DestinationRefused, match="token endpoint is plain HTTP"):
                    await client.exists("kmm/mod", "v1")
        # The credentials went to the plain-HTTP realm only when insecure.
        assert [a for _, _, a in token.seen] == ([_BASIC] if insecure else [])
        registry.realm = ""
        registry.location = f"http://127.0.0.1:{token.port}/blobs/x"
        async with _https_client(registry, authority.ca_cert, trusted, insecure=insecure) as client:
            if insecure:
                assert await client.exists("kmm/mod", "v1") is not None
            else:
                with pytest.raises(errors.DestinationRefused, match="redirected to plain HTTP"):
                    await client.exists("kmm/mod", "v1")
        assert len(token.seen) == (2 if insecure else 0)
    finally:
        for server in servers:
            await server.close()
