"""Probes identify themselves as the kubelet release the emulator follows."""

from __future__ import annotations

import asyncio

from kmm.kubelet import nodes, probes


def test_the_emulator_is_the_1_37_kubelet() -> None:
    assert nodes.KUBELET_VERSION == "v1.37.2-kmm-emulator"
    assert probes.USER_AGENT == "kube-probe/1.37"


async def _exec(argv: list[str], timeout: float) -> bool:
    raise AssertionError("no exec probe here")


async def test_an_http_probe_sends_the_kubelets_user_agent() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (line := await reader.readline()) not in (b"\r\n", b""):
            seen.append(line)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        probe = {"httpGet": {"path": "/healthz", "port": port}, "timeoutSeconds": 5}
        assert await probes.check(probe, {"name": "c"}, _exec)
    finally:
        server.close()
        await server.wait_closed()
    assert b"User-Agent: kube-probe/1.37\r\n" in seen
    assert seen[0] == b"GET /healthz HTTP/1.0\r\n"
