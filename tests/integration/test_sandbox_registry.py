"""The sandbox registry (the real distribution binary on loopback) and kmm.oci
against it: pushes, manifest HEADs in both media-type families, requests
counted from the registry's access log, and each authentication outcome.

Most tests run the registry alone (``registry.start`` with the sandbox
launcher's signature and a sandbox record of its own): a control plane buys
them nothing. One test brings a whole sandbox up with ``--registry-auth``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import ociarchives
import pytest
from aiohttp import web

from kmm.cli import paths
from kmm.oci import archive, auth, errors, mediatypes, pushing
from kmm.oci import client as oci_client
from kmm.operator.build import asking, existence
from kmm.sandbox import (
    addressing,
    building,
    cluster,
    components,
    health,
    namespaces,
    pki,
    processes,
    registry,
    state,
)

_USER, _PASSWORD = "pusher", "correct:horse"
_KMM = Path(sys.executable).with_name("kmm")


def _binary() -> Path:
    built = asyncio.run(building.ensure_built(paths.cache_dir(), (components.REGISTRY,)))
    return built["registry"]


def _start(directory: Path, auth_: registry.Auth | None) -> state.SandboxState:
    """A registry alone, recorded in ``directory`` as a sandbox records it."""
    directory.mkdir(parents=True, exist_ok=True)
    record = state.SandboxState(
        directory=directory,
        server="",
        kubeconfig=directory / "kubeconfig",
        launched=[],
        node_names=[],
        versions={},
    )

    def launch(name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=directory / "logs" / f"{name}.log", health_url=health_url
        )
        record.launched.append(process)
        return process

    credentials = pki.create(directory / "pki", ())
    process, record.registry = registry.start(launch, directory, _binary(), credentials, auth=auth_)
    state.save(record)
    asyncio.run(health.wait_healthy(process, timeout=120))
    return record


def _stop(record: state.SandboxState) -> None:
    for process in record.launched:
        process.stop()


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.SandboxState]:
    record = _start(tmp_path_factory.mktemp("registry-open"), None)
    try:
        yield record
    finally:
        _stop(record)


@pytest.fixture(scope="module")
def locked_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.SandboxState]:
    record = _start(tmp_path_factory.mktemp("registry-auth"), registry.Auth(_USER, _PASSWORD))
    try:
        yield record
    finally:
        _stop(record)


def _requests(record: state.SandboxState) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request in the registry's access log."""
    log = record.directory / "logs" / f"{registry.COMPONENT}.log"
    return [
        (m.group(1), m.group(2), int(m.group(3)))
        for m in re.finditer(
            r'"(GET|HEAD|POST|PUT|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d+)', log.read_text()
        )
    ]


def _push_cli(directory: Path, archive: Path, name_tag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(_KMM),
            "sandbox",
            "push",
            "--dir",
            str(directory),
            str(archive),
            name_tag,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # Wide: rich wraps error lines at the terminal width.
        env={**os.environ, "COLUMNS": "1000"},
    )


@pytest.fixture
async def open_client(open_registry: state.SandboxState) -> AsyncIterator[oci_client.Client]:
    async with registry.client(open_registry) as client:
        yield client


def test_push_twice_uploads_each_blob_once_and_prints_the_gateway_reference(
    open_registry: state.SandboxState, tmp_path: Path
) -> None:
    layers = [ociarchives.layer({"hello": b"#!/bin/sh\necho hi\n"}), ociarchives.layer({"x": b"y"})]
    made = ociarchives.write(tmp_path / "image.tar", layers)
    before = len(_requests(open_registry))
    first = _push_cli(open_registry.directory, made.path, "kmm/hello:v1")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "10.253.0.1:5000/kmm/hello:v1"
    assert "uploading blob" in first.stderr
    after_first = _requests(open_registry)[before:]
    uploads = [r for r in after_first if r[0] == "PUT" and "/blobs/uploads/" in r[1]]
    assert sorted(
        re.search(r"digest=([^&]+)", r[1]).group(1).replace("%3A", ":") for r in uploads
    ) == sorted(made.blob_digests)  # type: ignore[union-attr]

    second = _push_cli(open_registry.directory, made.path, "kmm/hello:v1")
    assert second.returncode == 0, second.stderr
    after_second = _requests(open_registry)[before + len(after_first) :]
    # Each blob asked for once, none uploaded again; the manifest put again.
    assert [r for r in after_second if "/blobs/uploads/" in r[1]] == []
    heads = [r for r in after_second if r[0] == "HEAD" and "/blobs/" in r[1]]
    assert sorted(r[1].rsplit("/", 1)[1] for r in heads) == sorted(made.blob_digests)
    assert all(status == 200 for _, _, status in heads)
    assert [r[:2] for r in after_second if r[0] == "PUT"] == [("PUT", "/v2/kmm/hello/manifests/v1")]


@pytest.mark.parametrize("docker", [False, True], ids=["oci", "docker"])
async def test_head_manifest_in_both_media_types(
    open_registry: state.SandboxState,
    open_client: oci_client.Client,
    tmp_path: Path,
    docker: bool,
) -> None:
    made = ociarchives.write(
        tmp_path / "image.tar", [ociarchives.layer({"a": b"b"})], docker=docker
    )
    pushed = _push_cli(
        open_registry.directory, made.path, f"kmm/types:{'docker' if docker else 'oci'}"
    )
    assert pushed.returncode == 0, pushed.stderr
    found = await open_client.head_manifest("kmm/types", "docker" if docker else "oci")
    assert found.digest == made.manifest_digest
    assert found.media_type == (mediatypes.DOCKER_MANIFEST if docker else mediatypes.OCI_MANIFEST)
    by_digest = await open_client.head_manifest("kmm/types", made.manifest_digest)
    assert by_digest.digest == made.manifest_digest
    descriptor, body = await open_client.get_manifest("kmm/types", made.manifest_digest)
    assert json.loads(body)["mediaType"] == descriptor.media_type


async def test_a_missing_manifest_is_not_found_and_exists_says_none(
    open_client: oci_client.Client,
) -> None:
    with pytest.raises(errors.NotFound, match="has no such manifest"):
        await open_client.head_manifest("kmm/nothing-here", "v1")
    assert await open_client.exists("kmm/nothing-here", "v1") is None


async def test_a_deleted_image_is_missing_afterwards(
    open_registry: state.SandboxState, open_client: oci_client.Client, tmp_path: Path
) -> None:
    made = ociarchives.write(tmp_path / "image.tar", [ociarchives.layer({"d": b"1"})])
    assert _push_cli(open_registry.directory, made.path, "kmm/deleted:v1").returncode == 0
    await open_client.delete_manifest("kmm/deleted", made.manifest_digest)
    assert await open_client.exists("kmm/deleted", "v1") is None


def test_push_names_what_is_wrong(open_registry: state.SandboxState, tmp_path: Path) -> None:
    not_archive = tmp_path / "plain.tar"
    not_archive.write_bytes(b"not a tar")
    done = _push_cli(open_registry.directory, not_archive, "kmm/x:v1")
    assert done.returncode == 1
    assert "is not a readable tar archive" in done.stderr
    no_sandbox = _push_cli(tmp_path / "nowhere", not_archive, "kmm/x:v1")
    assert no_sandbox.returncode == 1
    assert "no sandbox recorded" in no_sandbox.stderr
    assert "has no tag" in _push_cli(open_registry.directory, not_archive, "kmm/x").stderr


def _credentials(password: str | None) -> auth.Credentials | None:
    return None if password is None else auth.Credentials(_USER, password)


def _client(record: state.SandboxState, password: str | None) -> oci_client.Client:
    assert record.registry is not None
    return oci_client.Client(
        record.registry.host,
        credentials=_credentials(password),
        ca_files=(record.directory / "pki" / "ca.crt",),
    )


async def test_auth_none_wrong_and_right(
    locked_registry: state.SandboxState, tmp_path: Path
) -> None:
    async with _client(locked_registry, None) as anonymous:
        with pytest.raises(errors.CredentialsRequired, match="wants credentials"):
            await anonymous.head_manifest("kmm/locked", "v1")
    async with _client(locked_registry, "wrong") as wrong:
        with pytest.raises(
            errors.CredentialsRejected, match=f"refused the credentials of user '{_USER}'"
        ):
            await wrong.head_manifest("kmm/locked", "v1")
    made = ociarchives.write(tmp_path / "image.tar", [ociarchives.layer({"l": b"1"})])
    pushed = _push_cli(locked_registry.directory, made.path, "kmm/locked:v1")
    assert pushed.returncode == 0, pushed.stderr
    async with _client(locked_registry, _PASSWORD) as right:
        assert (await right.head_manifest("kmm/locked", "v1")).digest == made.manifest_digest
        # With credentials that work, absence is still NotFound, not an auth error.
        with pytest.raises(errors.NotFound):
            await right.head_manifest("kmm/locked", "v2")


def test_push_with_a_rejected_password_names_the_refusal(
    locked_registry: state.SandboxState, tmp_path: Path
) -> None:
    assert locked_registry.registry is not None
    assert locked_registry.registry.credentials is not None
    document = json.loads(locked_registry.registry.credentials.read_text())
    host = locked_registry.registry.host
    assert base64.b64decode(document["auths"][host]["auth"]).decode() == f"{_USER}:{_PASSWORD}"
    # The file the push reads, with the password changed.
    wrong = dict(document)
    wrong["auths"] = {host: {"username": _USER, "password": "nope"}}
    original = locked_registry.registry.credentials.read_text()
    locked_registry.registry.credentials.write_text(json.dumps(wrong))
    try:
        made = ociarchives.write(tmp_path / "image.tar", [ociarchives.layer({"r": b"1"})])
        done = _push_cli(locked_registry.directory, made.path, "kmm/refused:v1")
    finally:
        locked_registry.registry.credentials.write_text(original)
    assert done.returncode == 1
    assert "refused the credentials of user 'pusher'" in done.stderr


def test_push_to_a_stopped_registry_says_it_is_not_running(tmp_path: Path) -> None:
    record = _start(tmp_path / "stopped", None)
    _stop(record)
    made = ociarchives.write(tmp_path / "image.tar", [])
    done = _push_cli(record.directory, made.path, "kmm/x:v1")
    assert done.returncode == 1
    assert "registry of the sandbox" in done.stderr
    assert "is not running" in done.stderr


def _get_in_namespace(net_path: str, ca: Path, path: str, authorization: str) -> bytes:
    """GET ``path`` of the registry at its reference address (the gateway),
    from inside a node's network namespace, verifying the sandbox CA."""
    context = ssl.create_default_context(cafile=str(ca))
    with namespaces.socket_in(net_path) as raw:
        raw.settimeout(30)
        raw.connect((str(addressing.GATEWAY), addressing.REGISTRY_PORT))
        with context.wrap_socket(raw, server_hostname=str(addressing.GATEWAY)) as tls:
            tls.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
                f"\r\nAuthorization: {authorization}\r\nAccept: {mediatypes.OCI_MANIFEST}"
                "\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    return answer


def test_up_with_registry_auth_serves_it_and_down_stops_it(tmp_path: Path) -> None:
    # Short: the kubelet node's sockets live under it.
    directory = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=0,
        kubelet_nodes=1,
        registry_auth=registry.Auth(_USER, _PASSWORD),
    )
    record = asyncio.run(cluster.up(options))
    try:
        assert record.registry is not None
        assert record.registry.reference_host == "10.253.0.1:5000"
        assert state.load(directory.resolve()) == record
        status = subprocess.run(
            [str(_KMM), "sandbox", "status", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert f"Registry 10.253.0.1:5000 (from the host: {record.registry.host}" in status.stdout
        made = ociarchives.write(tmp_path / "image.tar", [ociarchives.layer({"u": b"1"})])
        pushed = _push_cli(directory, made.path, "kmm/up:v1")
        assert pushed.returncode == 0, pushed.stderr
        assert pushed.stdout.splitlines()[-1] == "10.253.0.1:5000/kmm/up:v1"
        # The reference works from a node: the relay serves the registry on
        # the gateway inside the fabric, under a certificate naming it.
        (holder,) = [p for p in record.launched if p.name.startswith("node/")]
        basic = base64.b64encode(f"{_USER}:{_PASSWORD}".encode()).decode()
        answer = _get_in_namespace(
            f"/proc/{holder.pid}/ns/net",
            directory / "pki" / "ca.crt",
            "/v2/kmm/up/manifests/v1",
            f"Basic {basic}",
        )
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    finally:
        stopped = cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
    assert registry.COMPONENT in [process.name for process in stopped]
    assert not any(process.alive() for process in record.launched)


async def test_a_layer_of_megabytes_is_pushed_in_process_without_a_warning(
    open_client: oci_client.Client, tmp_path: Path
) -> None:
    # Past aiohttp's 1 MiB a bytes body draws a ResourceWarning (an error
    # here, and the loop blocked while it is sent): layers go as streams.
    big = os.urandom(3 * 1024 * 1024)
    made = ociarchives.write(tmp_path / "big.tar", [ociarchives.layer({"big": big})])
    with archive.Archive(made.path) as opened:
        pushed = await pushing.push(open_client, opened, "kmm/big", "v1")
    assert pushed.digest == made.manifest_digest
    assert await open_client.exists("kmm/big", "v1") is not None


# Inside a network namespace of the test's own (the rule: traffic stays in
# namespaces the sandbox makes): a registry whose manifests redirect, the
# storage it redirects to, a registry whose Bearer realm is the cloud
# metadata address, and listeners on that address and on loopback that
# count whoever reaches them.
_REGISTRY, _STORAGE, _BEARER = "192.0.2.1:5000", "192.0.2.2:5000", "192.0.2.3:5000"
_METADATA = "169.254.169.254"
_LOOPBACK = "127.0.0.1:5001"
_BASIC = "Basic " + base64.b64encode(b"robot:s3cret").decode()
_REDIRECTS = {
    "v1": f"http://{_STORAGE}/objects/kmm/mod/v1",
    "v2": f"http://{_STORAGE}/objects/kmm/mod/v2",
    "meta": f"http://{_METADATA}/latest/meta-data/iam/",
    "loop": f"http://{_LOOPBACK}/x",
    "mapped": "http://[::ffff:127.0.0.1]:5001/x",
}


class _Launcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.launched: list[processes.Process] = []

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=self.directory / f"{name}.log", health_url=health_url
        )
        self.launched.append(process)
        return process


async def _redirect_world() -> tuple[dict[str, existence.Fact | None], dict[str, list[str]]]:
    """Serve the doubles, check each image with the operator's checker (no
    configured endpoint: nothing is trusted); the facts and who saw what."""
    seen: dict[str, list[str]] = {n: [] for n in ("registry", "storage", "bearer", "metadata", "loopback")}  # fmt: skip

    async def registry_(request: web.Request) -> web.Response:
        seen["registry"].append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != _BASIC:
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        return web.Response(status=307, headers={"Location": _REDIRECTS[request.match_info["ref"]]})

    async def storage(request: web.Request) -> web.Response:
        seen["storage"].append(f"{request.path} {request.headers.get('Authorization', '')}")
        if request.path.endswith("/v1"):
            return web.Response(
                headers={
                    "Content-Type": mediatypes.OCI_MANIFEST,
                    "Docker-Content-Digest": "sha256:" + "e" * 64,
                }
            )
        return web.Response(status=404)

    async def bearer(request: web.Request) -> web.Response:
        seen["bearer"].append(request.path)
        realm = f'Bearer realm="http://{_METADATA}/token",service="double"'
        return web.Response(status=401, headers={"WWW-Authenticate": realm})

    def counting(name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            seen[name].append(request.path)
            return web.Response(text="secret credentials")

        return handle

    routes = {
        _REGISTRY: ("/v2/kmm/mod/manifests/{ref}", registry_),
        _STORAGE: ("/{tail:.*}", storage),
        _BEARER: ("/{tail:.*}", bearer),
        f"{_METADATA}:80": ("/{tail:.*}", counting("metadata")),
        _LOOPBACK: ("/{tail:.*}", counting("loopback")),
    }
    runners: list[web.AppRunner] = []
    checker = existence.Checker(asking.Asker(timeout=5.0))
    try:
        for address, (path, handler) in routes.items():
            app = web.Application()
            app.router.add_route("*", path, handler)
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            host, _, port = address.rpartition(":")
            await web.TCPSite(runner, host, int(port)).start()
        document = json.dumps({"auths": {_REGISTRY: {"username": "robot", "password": "s3cret"}}})
        secret = {
            "metadata": {"resourceVersion": "1"},
            "data": {".dockerconfigjson": base64.b64encode(document.encode()).decode()},
        }

        async def secrets(_namespace: str, _name: str) -> dict[str, Any]:
            return secret

        insecure = existence.Tls(insecure=True)
        keys = {
            ref: existence.Key(f"{_REGISTRY}/kmm/mod:{ref}", insecure, "ns/repo")
            for ref in _REDIRECTS
        }
        keys["direct"] = existence.Key(f"{_METADATA}/latest:meta-data", insecure)
        keys["realm"] = existence.Key(f"{_BEARER}/kmm/mod:v1", insecure)
        for key in keys.values():
            checker.fact(key, secrets)
        await checker.settled()
        return {name: checker.known(key) for name, key in keys.items()}, seen
    finally:
        await checker.close()
        for runner in runners:
            await runner.cleanup()


def test_manifest_redirects_are_followed_and_guarded_in_a_namespace(tmp_path: Path) -> None:
    """registry.k8s.io answers every manifest request with a redirect: the
    checker follows it, without the registry's credentials, but never to
    the metadata address or loopback, nor to a realm there (none of those
    listeners is reached)."""
    launcher = _Launcher(tmp_path)
    holder = namespaces.start_holder(launcher, "redirects")
    try:
        addresses = ("192.0.2.1/32", "192.0.2.2/32", "192.0.2.3/32", f"{_METADATA}/32")
        namespaces.run_in(
            holder,
            ["ip", "-batch", "-"],
            stdin="".join(f"addr add {a} dev lo\n" for a in addresses),
        )
        found: list[Any] = []

        def in_namespace() -> None:
            try:
                namespaces.enter(holder.net_path)  # this thread only, for good
                found.append(asyncio.run(_redirect_world()))
            except BaseException as err:  # handed to the test's thread
                found.append(err)

        worker = threading.Thread(target=in_namespace, name="redirects")
        worker.start()
        worker.join()
    finally:
        for process in launcher.launched:
            process.stop()
    if isinstance(found[0], BaseException):
        raise found[0]
    facts, seen = found[0]
    states = {name: (f.state.value, f.failure) if f else None for name, f in facts.items()}
    assert states == {
        "v1": ("Exists", ""),
        "v2": ("Missing", ""),
        "meta": ("Error", "DestinationRefused"),
        "loop": ("Error", "DestinationRefused"),
        "mapped": ("Error", "DestinationRefused"),
        "direct": ("Error", "DestinationRefused"),
        "realm": ("Error", "DestinationRefused"),
    }
    assert "link-local" in facts["meta"].message
    assert "loopback" in facts["loop"].message
    assert "loopback" in facts["mapped"].message
    assert all(facts[n].undecided for n in ("meta", "loop", "mapped", "direct", "realm"))
    # Nothing of the operator's network in what a Module's author reads
    # (the direct image names the address itself).
    told = [f.message for name, f in facts.items() if f and name != "direct"]
    assert not any(_METADATA in m or "127.0.0.1" in m or _STORAGE in m for m in told), told
    assert seen["metadata"] == []
    assert seen["loopback"] == []
    # The storage got the manifest requests, never the registry's credentials.
    assert seen["storage"]
    assert all(entry.endswith(" ") for entry in seen["storage"])
    assert _BASIC in seen["registry"]
    assert seen["bearer"] == ["/v2/kmm/mod/manifests/v1"]  # over http, once https failed
