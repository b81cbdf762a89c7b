"""A kubeconfig's client certificate, as a container with a read-only root
filesystem uses it: no writable temporary directory anywhere.

Python's ssl loads a certificate chain from files only; the client must
still present the certificate to a server that requires one (a TLS server
on loopback, with certificates from the sandbox's own PKI code).
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from kmm.kube import client, kubeconfigs
from kmm.sandbox import pki

ADMIN = pki.ClientIdentity("admin", "kmm-admin", ("system:masters",))


@pytest.fixture
def certificates(tmp_path: Path) -> pki.Pki:
    return pki.create(tmp_path / "pki", (ADMIN,))


@pytest.fixture
async def server(certificates: pki.Pki) -> AsyncIterator[str]:
    """An HTTPS server on loopback requiring a client certificate from the
    CA; it answers the certificate's common name."""

    async def whoami(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(entry[0] for entry in (peer or {}).get("subject", ()))
        return web.json_response({"user": subject.get("commonName")})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.serving_cert, certificates.serving_key)
    context.load_verify_locations(cafile=str(certificates.ca_cert))
    context.verify_mode = ssl.CERT_REQUIRED
    runner = web.AppRunner(app)
    await runner.setup()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, listener, ssl_context=context)
    await site.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        await runner.cleanup()
        listener.close()


async def test_a_client_certificate_works_without_a_writable_temporary_directory(
    server: str, certificates: pki.Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a read-only root filesystem leaves Python: no usable /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "read-only" / "tmp"))
    access = kubeconfigs.Access(
        server=server,
        source="test",
        ca_data=certificates.ca_cert.read_bytes(),
        client_cert_data=certificates.client_cert(ADMIN).read_bytes(),
        client_key_data=certificates.client_key(ADMIN).read_bytes(),
    )
    async with client.Client(access, max_attempts=1) as api:
        assert await api.request("GET", "/whoami") == {"user": "kmm-admin"}
    assert not (tmp_path / "read-only").exists()


async def test_without_memory_files_a_private_directory_is_used_and_removed(
    server: str, certificates: pki.Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A system without memfd_create (macOS, for the CLI): a temporary directory.
    monkeypatch.delattr(os, "memfd_create")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    access = kubeconfigs.Access(
        server=server,
        source="test",
        ca_data=certificates.ca_cert.read_bytes(),
        client_cert_data=certificates.client_cert(ADMIN).read_bytes(),
        client_key_data=certificates.client_key(ADMIN).read_bytes(),
    )
    async with client.Client(access, max_attempts=1) as api:
        assert await api.request("GET", "/whoami") == {"user": "kmm-admin"}
    assert list(temporary.iterdir()) == []
