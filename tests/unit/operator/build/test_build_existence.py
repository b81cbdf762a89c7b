"""The existence checker against a registry double on loopback (Basic auth,
as the sandbox's htpasswd registry): what it answers, what it remembers, and
how many requests that costs."""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kmm.oci import mediatypes, references
from kmm.operator.build import existence
from kmm.sandbox import pki

_DIGEST = "sha256:" + "b" * 64


@dataclasses.dataclass
class _Registry:
    tags: dict[str, set[str]]
    user: str = "robot"
    password: str = "s3cret"
    requests: int = 0
    failing: bool = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        return app

    async def manifest(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.failing:
            return web.Response(status=503)
        expected = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        if request.match_info["reference"] not in self.tags.get(request.match_info["name"], ()):
            return web.Response(status=404)
        return web.Response(
            headers={"Content-Type": mediatypes.OCI_MANIFEST, "Docker-Content-Digest": _DIGEST}
        )


@pytest.fixture
async def plain() -> AsyncIterator[tuple[_Registry, str]]:
    registry = _Registry({"kmm/mod": {"v1"}})
    server = TestServer(registry.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield registry, f"127.0.0.1:{server.port}"
    finally:
        await server.close()


def _secret(user: str, password: str, host: str, version: str = "1") -> dict[str, Any]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    document = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return {
        "metadata": {"name": "repo", "namespace": "ns", "resourceVersion": version},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(document).decode()},
    }


class _Secrets:
    def __init__(self, secret: dict[str, Any] | None) -> None:
        self.secret = secret
        self.reads = 0

    async def __call__(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == ("ns", "repo")
        self.reads += 1
        return self.secret


_INSECURE = existence.Tls(insecure=True)


async def test_a_fact_is_remembered_until_forgotten(plain: tuple[_Registry, str]) -> None:
    registry, host = plain
    secrets = _Secrets(_secret("robot", "s3cret", host))
    checker = existence.Checker()
    here = existence.Key(f"{host}/kmm/mod:v1", _INSECURE, "ns/repo")
    absent = existence.Key(f"{host}/kmm/mod:v2", _INSECURE, "ns/repo")
    assert (await checker.fact(here, secrets)).state is existence.State.EXISTS
    assert (await checker.fact(absent, secrets)).state is existence.State.MISSING
    asked = registry.requests
    for _ in range(3):  # a converged Module: nothing asked of anyone
        assert (await checker.fact(here, secrets)).state is existence.State.EXISTS
        assert (await checker.fact(absent, secrets)).state is existence.State.MISSING
    assert registry.requests == asked
    assert secrets.reads == 2
    assert checker.checks == {"Exists": 1, "Missing": 1}
    registry.tags["kmm/mod"].add("v2")  # built meanwhile
    checker.forget(absent.image)
    assert (await checker.fact(absent, secrets)).state is existence.State.EXISTS
    assert registry.requests > asked
    # Every HTTP request is counted (https refused, http challenged, http answered).
    assert checker.requests >= registry.requests


async def test_rejected_credentials_are_asked_again_only_once_the_secret_changed(
    plain: tuple[_Registry, str],
) -> None:
    registry, host = plain
    secrets = _Secrets(_secret("robot", "wrong", host, version="7"))
    checker = existence.Checker()
    key = existence.Key(f"{host}/kmm/mod:v1", _INSECURE, "ns/repo")
    found = await checker.fact(key, secrets)
    assert found.state is existence.State.AUTH_FAILED
    assert "ns/repo" in found.message
    assert "refused the credentials" in found.message
    asked = registry.requests
    assert (await checker.fact(key, secrets)).state is existence.State.AUTH_FAILED
    assert registry.requests == asked  # the Secret was read; the registry not asked
    secrets.secret = _secret("robot", "s3cret", host, version="8")
    assert (await checker.fact(key, secrets)).state is existence.State.EXISTS


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        (None, "ns/repo does not exist"),
        ({"metadata": {"resourceVersion": "1"}, "data": {}}, "no .dockerconfigjson"),
    ],
)
async def test_an_unusable_secret_is_an_authentication_error(
    plain: tuple[_Registry, str], secret: dict[str, Any] | None, words: str
) -> None:
    registry, host = plain
    checker = existence.Checker()
    found = await checker.fact(
        existence.Key(f"{host}/kmm/mod:v1", _INSECURE, "ns/repo"), _Secrets(secret)
    )
    assert found.state is existence.State.AUTH_FAILED
    assert words in found.message
    assert registry.requests == 0


async def test_other_failures_are_retried_after_a_backoff(plain: tuple[_Registry, str]) -> None:
    registry, host = plain
    registry.failing = True
    now = [100.0]
    checker = existence.Checker(clock=lambda: now[0], retry_initial=5.0)
    key = existence.Key(f"{host}/kmm/mod:v1", _INSECURE, "ns/repo")
    secrets = _Secrets(_secret("robot", "s3cret", host))
    found = await checker.fact(key, secrets)
    assert found.state is existence.State.ERROR
    assert "503" in found.message
    asked = registry.requests
    await checker.fact(key, secrets)
    assert registry.requests == asked
    assert not checker.due(key)
    now[0] += 5.0
    assert checker.due(key)
    registry.failing = False
    assert (await checker.fact(key, secrets)).state is existence.State.EXISTS


async def test_plain_http_only_when_the_registry_is_insecure(
    plain: tuple[_Registry, str],
) -> None:
    _, host = plain
    checker = existence.Checker(retry_initial=60.0)
    secrets = _Secrets(_secret("robot", "s3cret", host))
    strict = existence.Key(f"{host}/kmm/mod:v1", existence.Tls(), "ns/repo")
    found = await checker.fact(strict, secrets)
    assert found.state is existence.State.ERROR


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.create(tmp_path_factory.mktemp("pki"), ())


async def _tls_registry(
    authority: pki.Pki, stem: str, dns_name: str
) -> tuple[_Registry, TestServer]:
    cert, key = pki.issue_serving(authority, stem, stem, dns_names=(dns_name,), ips=())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    registry = _Registry({"kmm/mod": {"v1"}})
    server = TestServer(registry.app(), host="127.0.0.1")
    await server.start_server(ssl=context)
    return registry, server


@pytest.mark.parametrize(("named", "state"), [("registry.test", "Exists"), ("other.test", "Error")])
async def test_an_endpoint_is_dialled_for_a_host_whose_name_tls_checks(
    authority: pki.Pki, named: str, state: str
) -> None:
    registry, server = await _tls_registry(authority, named.split(".")[0], named)
    try:
        host = "registry.test:5000"
        checker = existence.Checker(
            ca_files=(authority.ca_cert,),
            endpoints=existence.parse_endpoints([f"{host}=127.0.0.1:{server.port}"]),
        )
        found = await checker.fact(
            existence.Key(f"{host}/kmm/mod:v1", existence.Tls(), "ns/repo"),
            _Secrets(_secret("robot", "s3cret", host)),
        )
        assert found.state.value == state, found.message
        assert registry.requests == (2 if state == "Exists" else 0)
    finally:
        await server.close()


async def test_skip_verify_accepts_a_certificate_nobody_vouches_for(authority: pki.Pki) -> None:
    _registry, server = await _tls_registry(authority, "unknown", "registry.test")
    try:
        host = f"127.0.0.1:{server.port}"
        checker = existence.Checker()  # the CA is not trusted
        secrets = _Secrets(_secret("robot", "s3cret", host))
        image = f"{host}/kmm/mod:v1"
        verified = await checker.fact(existence.Key(image, existence.Tls(), "ns/repo"), secrets)
        assert verified.state is existence.State.ERROR
        skipping = existence.Tls(skip_verify=True)
        found = await checker.fact(existence.Key(image, skipping, "ns/repo"), secrets)
        assert found.state is existence.State.EXISTS, found.message
    finally:
        await server.close()


async def test_insecure_accepts_an_unvouched_certificate_as_the_builder_does(
    authority: pki.Pki,
) -> None:
    # The build pod pushes with --tls-verify=false for an insecure registry:
    # the check must see what it pushed, over the same HTTPS.
    _registry, server = await _tls_registry(authority, "selfsigned", "registry.test")
    try:
        host = f"127.0.0.1:{server.port}"
        found = await existence.Checker().fact(
            existence.Key(f"{host}/kmm/mod:v1", _INSECURE, "ns/repo"),
            _Secrets(_secret("robot", "s3cret", host)),
        )
        assert found.state is existence.State.EXISTS, found.message
    finally:
        await server.close()


@pytest.mark.parametrize("pair", ["10.253.0.1:5000", "=127.0.0.1:1", "a=", "https://a=127.0.0.1:1"])
def test_a_malformed_endpoint_is_refused(pair: str) -> None:
    with pytest.raises(ValueError, match="HOST=ENDPOINT"):
        existence.parse_endpoints([pair])


@pytest.mark.parametrize(
    ("image", "parsed"),
    [
        ("10.253.0.1:5000/kmm/mod:6.1", ("10.253.0.1:5000", "kmm/mod", "6.1")),
        ("quay.io/a/b@sha256:" + "c" * 64, ("quay.io", "a/b", "sha256:" + "c" * 64)),
        ("localhost/x:1", ("localhost", "x", "1")),
        ("busybox:1.36", (references.DOCKER_HUB, "library/busybox", "1.36")),
        ("user/app:2", (references.DOCKER_HUB, "user/app", "2")),
    ],
)
def test_references_split_as_runtimes_read_them(image: str, parsed: tuple[str, ...]) -> None:
    found = references.parse(image)
    assert (found.host, found.name, found.reference) == parsed


def test_a_reference_without_tag_or_digest_is_refused() -> None:
    with pytest.raises(ValueError, match="no tag"):
        references.parse("quay.io/a/b")
