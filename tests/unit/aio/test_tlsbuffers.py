"""TLS read buffers: the operator sizes them before its first connection, and
an answer many times their size still arrives whole."""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kmm import cli
from kmm.aio import tlsbuffers
from kmm.cli import operating
from kmm.sandbox import pki


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # The size is the process's: put back what the test run had.
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", sslproto.SSLProtocol.max_size)


async def test_an_answer_larger_than_the_buffer_arrives_whole(
    restored: None, tmp_path: Path
) -> None:
    tlsbuffers.limit()
    assert sslproto.SSLProtocol.max_size == tlsbuffers.SIZE
    authority = pki.create(tmp_path, ())
    cert, key = pki.issue_serving(authority, "s", "s", dns_names=("server.test",), ips=())
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(cert, key)
    answer = bytes(range(256)) * 4096  # 1 MiB, 32 buffers

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=serving)
    port = server.sockets[0].getsockname()[1]
    trusting = ssl.create_default_context(cafile=str(authority.ca_cert))
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=trusting, server_hostname="server.test"
        )
        received = await reader.read(-1)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert received == answer


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_the_operator_reads_tls_into_small_buffers(
    restored: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []

    async def main(api: Any, settings: Any) -> None:
        sizes.append(sslproto.SSLProtocol.max_size)  # as the operator's connections see it
        await api.close()

    monkeypatch.setattr(operating, "_main", main)
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", 256 * 1024)
    result = CliRunner().invoke(
        cli.build("operator"),
        ["operator", "--kubeconfig", str(_kubeconfig(tmp_path))],
        env={"POD_NAME": "p", "POD_NAMESPACE": "n"},
    )
    assert result.exit_code == 0, result.output
    assert sizes == [tlsbuffers.SIZE]
