"""One existence check (``asking.Asker``) against registry doubles on
loopback (Basic auth, as the sandbox's htpasswd registry), reached as the
operator's configured endpoints: what it answers (the digest and kmm's
labels of an image that exists), what a tenant may read of it, what it
refuses to dial, and how many requests that costs; and the delete of a
manifest, with the answers of registries that refuse it."""

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

from kmm.api import labels
from kmm.oci import descriptors, mediatypes, references
from kmm.operator.build import asking, existence
from kmm.sandbox import pki

# An image config with kmm's labels and someone else's.
_CONFIG = json.dumps(
    {
        "config": {
            "Labels": {
                labels.IMAGE_BUILD_HASH: "b1",
                labels.IMAGE_SIGNED: "true",
                "org.opencontainers.image.title": "not kept",
            }
        }
    }
).encode()
_MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": mediatypes.OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": descriptors.sha256_digest(_CONFIG),
            "size": len(_CONFIG),
        },
        "layers": [],
    }
).encode()
_DIGEST = descriptors.sha256_digest(_MANIFEST)


@dataclasses.dataclass
class _Registry:
    tags: dict[str, set[str]]
    user: str = "robot"
    password: str = "s3cret"
    requests: int = 0
    failing: bool = False
    manifest_body: bytes = _MANIFEST
    media_type: str = mediatypes.OCI_MANIFEST
    # What DELETE answers: status and distribution error code.
    delete_answer: tuple[int, str] = (202, "")
    deleted: list[str] = dataclasses.field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        app.router.add_route("GET", "/v2/{name:.+}/blobs/{digest}", self.blob)
        return app

    def _refused(self, request: web.Request) -> web.Response | None:
        self.requests += 1
        if self.failing:
            return web.Response(status=503)
        expected = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        return None

    async def manifest(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if request.method == "DELETE":
            status, code = self.delete_answer
            self.deleted.append(request.match_info["reference"])
            body = json.dumps({"errors": [{"code": code, "message": "m"}]}) if code else ""
            return web.Response(status=status, text=body)
        if request.match_info["reference"] not in self.tags.get(request.match_info["name"], ()):
            return web.Response(status=404)
        return web.Response(
            body=self.manifest_body,
            headers={
                "Content-Type": self.media_type,
                "Docker-Content-Digest": descriptors.sha256_digest(self.manifest_body),
            },
        )

    async def blob(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if request.match_info["digest"] != descriptors.sha256_digest(_CONFIG):
            return web.Response(status=404)
        return web.Response(body=_CONFIG)


_HOST = "registry.test:5000"


@pytest.fixture
async def plain() -> AsyncIterator[tuple[_Registry, asking.Asker]]:
    """The registry on loopback, and an asker dialling it for ``_HOST``."""
    registry = _Registry({"kmm/mod": {"v1"}})
    server = TestServer(registry.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield registry, asking.Asker(endpoints={_HOST: f"127.0.0.1:{server.port}"})
    finally:
        await server.close()


def _secret(user: str, password: str, host: str = _HOST, version: str = "1") -> dict[str, Any]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    document = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return {
        "metadata": {"name": "repo", "namespace": "ns", "resourceVersion": version},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(document).decode()},
    }


_INSECURE = existence.Tls(insecure=True)
_KEY = existence.Key(f"{_HOST}/kmm/mod:v1", _INSECURE, "ns/repo")


async def test_exists_missing_and_every_request_counted(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    registry, asker = plain
    secret = _secret("robot", "s3cret")
    there = await asker(_KEY, secret)
    assert there.state is existence.State.EXISTS
    assert there.digest == _DIGEST
    # kmm's labels, and only those: someone else's are not kept.
    assert there.labels == {labels.IMAGE_BUILD_HASH: "b1", labels.IMAGE_SIGNED: "true"}
    absent = dataclasses.replace(_KEY, image=f"{_HOST}/kmm/mod:v2")
    found = await asker(absent, secret)
    assert (found.state, found.message) == (
        existence.State.MISSING,
        f"{absent.image} does not exist",
    )
    # https refused, then http challenged and answered, for each; the
    # image that exists costs one more: its config.
    assert asker.requests == 7
    assert registry.requests == 5


async def test_an_index_exists_with_labels_not_known(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    registry, asker = plain
    registry.media_type = mediatypes.OCI_INDEX
    registry.manifest_body = json.dumps(
        {"schemaVersion": 2, "mediaType": mediatypes.OCI_INDEX, "manifests": []}
    ).encode()
    found = await asker(_KEY, _secret("robot", "s3cret"))
    assert (found.state, found.labels) == (existence.State.EXISTS, None)
    assert found.digest == descriptors.sha256_digest(registry.manifest_body)
    assert registry.requests == 2  # challenged, answered: no config to read


async def test_an_answer_past_the_bound_is_an_error_not_read_whole(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    registry, asker = plain
    registry.manifest_body = b"{" + b" " * asking.MAX_BODY + b"}"
    found = await asker(_KEY, _secret("robot", "s3cret"))
    assert (found.state, found.failure) == (existence.State.ERROR, "UnexpectedResponse")
    assert f"more than {asking.MAX_BODY} bytes" in found.message


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ((202, ""), "deleted"),
        ((404, "MANIFEST_UNKNOWN"), "deleted"),
        ((405, "UNSUPPORTED"), "refused"),
        ((400, "UNSUPPORTED"), "refused"),
        ((403, "DENIED"), "refused"),
        ((500, ""), "failed"),
    ],
)
async def test_a_delete_and_how_registries_refuse_it(
    plain: tuple[_Registry, asking.Asker], answer: tuple[int, str], outcome: str
) -> None:
    registry, asker = plain
    registry.delete_answer = answer
    done = await asker.delete(_KEY, _secret("robot", "s3cret"), _DIGEST)
    assert done.outcome == outcome, done
    assert registry.deleted == [_DIGEST]
    assert "m" not in done.message.split()  # the registry's own words are not shown


async def test_rejected_credentials_name_the_secret(plain: tuple[_Registry, asking.Asker]) -> None:
    _, asker = plain
    found = await asker(_KEY, _secret("robot", "wrong", version="7"))
    assert found.state is existence.State.AUTH_FAILED
    assert found.secret_version == "7"
    assert "ns/repo" in found.message
    assert "refused the credentials of user 'robot'" in found.message
    assert not found.undecided


async def test_credentials_required_without_a_secret_is_undecided(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    _, asker = plain
    found = await asker(dataclasses.replace(_KEY, secret=""), None)
    assert found.state is existence.State.AUTH_FAILED
    assert "wants credentials and none are configured" in found.message
    assert found.undecided  # a node's credential provider may have some


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        (None, "ns/repo does not exist"),
        ({"metadata": {"resourceVersion": "1"}, "data": {}}, "no .dockerconfigjson"),
    ],
)
async def test_an_unusable_secret_is_an_authentication_error(
    plain: tuple[_Registry, asking.Asker], secret: dict[str, Any] | None, words: str
) -> None:
    registry, asker = plain
    found = await asker(_KEY, secret)
    assert found.state is existence.State.AUTH_FAILED
    assert words in found.message
    assert registry.requests == 0


async def test_a_failure_tells_its_class_and_status(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    registry, asker = plain
    registry.failing = True
    found = await asker(_KEY, _secret("robot", "s3cret"))
    assert found.state is existence.State.ERROR
    assert (found.failure, found.status) == ("UnexpectedResponse", 503)
    assert found.message == f"{_KEY.image}: GET /v2/kmm/mod/manifests/v1: {_HOST} answered 503"


async def test_plain_http_only_when_the_registry_is_insecure(
    plain: tuple[_Registry, asking.Asker],
) -> None:
    registry, asker = plain
    strict = dataclasses.replace(_KEY, tls=existence.Tls())
    found = await asker(strict, _secret("robot", "s3cret"))
    assert found.state is existence.State.ERROR
    assert (found.failure, found.undecided) == ("Unreachable", True)
    # It speaks plain HTTP: the TLS handshake fails, and nothing is asked.
    what = "GET /v2/kmm/mod/manifests/v1"
    assert found.message == f"{strict.image}: {what}: the TLS handshake with {_HOST} failed"
    assert registry.requests == 0


@pytest.mark.parametrize(
    "image",
    [
        "MyOrg/driver:v1",
        f"{_HOST}/MyOrg/driver:v1",
        f"{_HOST}/kmm/mod:" + "t" * 129,
        f"{_HOST}/kmm/mod:-leading-dash",
        f"{_HOST}/" + "a/" * 130 + "mod:v1",
        f"{_HOST}/kmm/mod",
    ],
)
async def test_a_name_the_client_refuses_is_a_fact_not_an_exception(
    plain: tuple[_Registry, asking.Asker], image: str
) -> None:
    registry, asker = plain
    found = await asker(dataclasses.replace(_KEY, image=image), _secret("robot", "s3cret"))
    assert (found.state, found.failure) == (existence.State.ERROR, "InvalidReference")
    assert registry.requests == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_host_on_loopback_is_not_dialled_unless_configured(
    plain: tuple[_Registry, asking.Asker], host: str
) -> None:
    registry, asker = plain
    port = asker.endpoints[_HOST].rsplit(":", 1)[1]
    image = f"{host}:{port}/kmm/mod:v1"
    found = await asking.Asker()(existence.Key(image, _INSECURE), None)
    assert (found.state, found.failure, found.undecided) == (
        existence.State.ERROR,
        "DestinationRefused",
        True,
    )
    assert "loopback" in found.message
    assert registry.requests == 0


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
        asker = asking.Asker(
            ca_files=(authority.ca_cert,),
            endpoints=asking.parse_endpoints([f"{_HOST}=127.0.0.1:{server.port}"]),
        )
        found = await asker(
            existence.Key(f"{_HOST}/kmm/mod:v1", existence.Tls(), "ns/repo"),
            _secret("robot", "s3cret"),
        )
        assert found.state.value == state, found.message
        assert registry.requests == (3 if state == "Exists" else 0)
        if state == "Error":
            assert found.message.endswith(f"the TLS certificate of {_HOST} is not trusted")
    finally:
        await server.close()


async def test_skip_verify_accepts_a_certificate_nobody_vouches_for(authority: pki.Pki) -> None:
    _registry, server = await _tls_registry(authority, "unknown", "registry.test")
    try:
        asker = asking.Asker(endpoints={_HOST: f"127.0.0.1:{server.port}"})  # CA not trusted
        secret = _secret("robot", "s3cret")
        image = f"{_HOST}/kmm/mod:v1"
        verified = await asker(existence.Key(image, existence.Tls(), "ns/repo"), secret)
        assert verified.state is existence.State.ERROR
        skipping = existence.Tls(skip_verify=True)
        found = await asker(existence.Key(image, skipping, "ns/repo"), secret)
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
        asker = asking.Asker(endpoints={_HOST: f"127.0.0.1:{server.port}"})
        found = await asker(_KEY, _secret("robot", "s3cret"))
        assert found.state is existence.State.EXISTS, found.message
    finally:
        await server.close()


@pytest.mark.parametrize("pair", ["10.253.0.1:5000", "=127.0.0.1:1", "a=", "https://a=127.0.0.1:1"])
def test_a_malformed_endpoint_is_refused(pair: str) -> None:
    with pytest.raises(ValueError, match="HOST=ENDPOINT"):
        asking.parse_endpoints([pair])


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
