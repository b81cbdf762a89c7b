"""Bearer auth as the distribution token spec has it (Docker Hub, GHCR, Quay):
an anonymous request gets a challenge naming the realm, the client fetches a
token for ``repository:<name>:<actions>`` with its credentials, and the
registry judges the token. The registry here is a double on loopback with
those semantics: its token endpoint checks Basic credentials and, as Docker
Hub does, grants a token without access to a repository that does not exist,
which the registry then answers 401 ``insufficient_scope``."""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kmm.oci import auth, errors, mediatypes
from kmm.oci.client import Client

_MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": mediatypes.OCI_MANIFEST}).encode()
_DIGEST = "sha256:" + "a" * 64


@dataclasses.dataclass
class _Registry:
    repositories: dict[str, set[str]]  # name -> tags
    user: str = "robot"
    password: str = "s3cret"
    granted: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # token -> repos
    scopes_asked: list[str] = dataclasses.field(default_factory=list)
    realm: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/token", self.token)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        app.router.add_get("/v2/", self.base)
        return app

    def _challenge(self, scope: str = "", error: str = "") -> web.Response:
        params = f'realm="{self.realm}",service="double"'
        if scope:
            params += f',scope="{scope}"'
        if error:
            params += f',error="{error}"'
        body = {"errors": [{"code": "UNAUTHORIZED" if not error else "DENIED", "message": "no"}]}
        return web.json_response(body, status=401, headers={"WWW-Authenticate": f"Bearer {params}"})

    async def token(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return web.json_response({"details": "login required"}, status=401)
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        if (user, password) != (self.user, self.password):
            return web.json_response({"details": "incorrect username or password"}, status=401)
        scope = request.query.get("scope", "")
        self.scopes_asked.append(scope)
        name = scope.split(":")[1] if scope.count(":") == 2 else ""
        token = secrets.token_hex(8)
        self.granted[token] = {name} if name in self.repositories else set()
        return web.json_response({"token": token, "expires_in": 300})

    def _token_of(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        return header[7:] if header.startswith("Bearer ") else None

    async def base(self, request: web.Request) -> web.Response:
        if self._token_of(request) not in self.granted:
            return self._challenge()
        return web.json_response({})

    async def manifest(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        scope = f"repository:{name}:pull"
        token = self._token_of(request)
        if token not in self.granted:
            return self._challenge(scope)
        if name not in self.granted[token]:
            return self._challenge(scope, "insufficient_scope")
        if request.match_info["reference"] not in self.repositories[name]:
            return web.json_response(
                {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "unknown"}]}, status=404
            )
        return web.Response(
            body=b"" if request.method == "HEAD" else _MANIFEST,
            headers={
                "Content-Type": mediatypes.OCI_MANIFEST,
                "Docker-Content-Digest": _DIGEST,
                "Content-Length": str(len(_MANIFEST)),
            },
        )


@pytest.fixture
async def double() -> AsyncIterator[tuple[_Registry, str]]:
    registry = _Registry(repositories={"kmm/loader": {"v1"}})
    server = TestServer(registry.app(), host="127.0.0.1")
    await server.start_server()
    registry.realm = f"http://127.0.0.1:{server.port}/token"
    try:
        yield registry, f"127.0.0.1:{server.port}"
    finally:
        await server.close()


def _client(host: str, credentials: auth.Credentials | None) -> Client:
    return Client(host, credentials=credentials, plain_http=True, actions=("pull",))


async def test_right_credentials_get_a_token_once_per_repository(
    double: tuple[_Registry, str],
) -> None:
    registry, host = double
    async with _client(host, auth.Credentials("robot", "s3cret")) as client:
        found = await client.head_manifest("kmm/loader", "v1")
        assert found.digest == _DIGEST
        assert found.media_type == mediatypes.OCI_MANIFEST
        assert (await client.get_manifest("kmm/loader", "v1"))[1] == _MANIFEST
    assert registry.scopes_asked == ["repository:kmm/loader:pull"]


async def test_a_missing_tag_in_a_granted_repository_is_not_found(
    double: tuple[_Registry, str],
) -> None:
    _, host = double
    async with _client(host, auth.Credentials("robot", "s3cret")) as client:
        with pytest.raises(errors.NotFound):
            await client.head_manifest("kmm/loader", "v2")
        assert await client.exists("kmm/loader", "v2") is None


async def test_a_repository_the_token_does_not_cover_is_scope_denied(
    double: tuple[_Registry, str],
) -> None:
    _, host = double
    async with _client(host, auth.Credentials("robot", "s3cret")) as client:
        with pytest.raises(errors.ScopeDenied, match="refused the granted token"):
            await client.head_manifest("kmm/absent", "v1")
        # For an existence check that is "missing", not an authentication error.
        assert await client.exists("kmm/absent", "v1") is None


async def test_wrong_and_absent_credentials_are_authentication_errors(
    double: tuple[_Registry, str],
) -> None:
    registry, host = double
    async with _client(host, auth.Credentials("robot", "wrong")) as client:
        with pytest.raises(errors.CredentialsRejected, match="refused the credentials of user"):
            await client.exists("kmm/loader", "v1")
    async with _client(host, None) as client:
        with pytest.raises(errors.CredentialsRequired, match="wants credentials"):
            await client.exists("kmm/loader", "v1")
    assert registry.scopes_asked == []
