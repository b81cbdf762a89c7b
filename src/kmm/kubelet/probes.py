"""Container probes as the kubelet runs them, against processes on this host.

``check`` runs one probe attempt: ``httpGet`` (a status from 200 to 399;
``host`` defaults to 127.0.0.1, where a process of an emulated node
listens), ``tcpSocket`` (the connection opens), ``grpc`` (the standard
``grpc.health.v1.Health/Check`` answers SERVING) or ``exec`` (the command,
translated like the container's own, exits 0), each within
``timeoutSeconds``. ``Prober`` repeats it every ``periodSeconds`` after
``initialDelaySeconds`` and turns results into a state with the kubelet's
``successThreshold`` / ``failureThreshold``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kmm.kubelet import nodes

__all__ = ["USER_AGENT", "Prober", "check"]


def _user_agent(version: str) -> str:
    """``kube-probe/<major>.<minor>``, as the kubelet's ``userAgent("probe")``
    (pkg/probe/http/request.go) builds it from its own version."""
    major, minor = version.removeprefix("v").split(".")[:2]
    return f"kube-probe/{major}.{minor}"


USER_AGENT = _user_agent(nodes.KUBELET_VERSION)

ExecRunner = Callable[[list[str], float], Awaitable[bool]]


def _port(value: Any, container: Mapping[str, Any]) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or ():
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"port {value!r} is not a port of the container")


async def _http(spec: Mapping[str, Any], container: Mapping[str, Any], timeout: float) -> bool:
    host = spec.get("host") or "127.0.0.1"
    port = _port(spec.get("port"), container)
    context = None
    if str(spec.get("scheme", "HTTP")).upper() == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context), timeout
    )
    try:
        headers = {"Host": f"{host}:{port}", "User-Agent": USER_AGENT, "Accept": "*/*"}
        headers.update({h["name"]: h["value"] for h in spec.get("httpHeaders") or ()})
        request = f"GET {spec.get('path') or '/'} HTTP/1.0\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        writer.write((request + "\r\n").encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = status.split()
    return len(parts) >= 2 and parts[1].isdigit() and 200 <= int(parts[1]) < 400


async def _tcp(spec: Mapping[str, Any], container: Mapping[str, Any], timeout: float) -> bool:
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(
            spec.get("host") or "127.0.0.1", _port(spec.get("port"), container)
        ),
        timeout,
    )
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _grpc(spec: Mapping[str, Any], timeout: float) -> bool:
    # The kubelet's gRPC probe sends the same User-Agent (pkg/probe/grpc/grpc.go).
    async with aio.insecure_channel(
        f"127.0.0.1:{int(spec['port'])}", options=[("grpc.primary_user_agent", USER_AGENT)]
    ) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # typed for the sync API
        answer = await stub.Check(
            health_pb2.HealthCheckRequest(service=str(spec.get("service") or "")), timeout=timeout
        )
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


async def check(
    probe: Mapping[str, Any], container: Mapping[str, Any], run_exec: ExecRunner
) -> bool:
    """One attempt; an error of any kind is a failure, as for the kubelet."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if probe.get("httpGet"):
            return await _http(probe["httpGet"], container, timeout)
        if probe.get("tcpSocket"):
            return await _tcp(probe["tcpSocket"], container, timeout)
        if probe.get("grpc"):
            return await _grpc(probe["grpc"], timeout)
        if probe.get("exec"):
            return await run_exec([str(w) for w in probe["exec"].get("command") or ()], timeout)
    except (OSError, TimeoutError, ValueError, grpc.RpcError):
        return False
    return False


class Prober:
    """One probe of one container, repeated; ``state`` is its verdict so far."""

    def __init__(
        self,
        probe: Mapping[str, Any],
        container: Mapping[str, Any],
        run_exec: ExecRunner,
        changed: Callable[[bool], None],
        *,
        initial: bool,
    ) -> None:
        self.probe, self.container, self.run_exec = probe, container, run_exec
        self.changed = changed
        self.state = initial

    async def run(self) -> None:
        await asyncio.sleep(float(self.probe.get("initialDelaySeconds") or 0))
        period = float(self.probe.get("periodSeconds") or 10)
        needed = {
            True: int(self.probe.get("successThreshold") or 1),
            False: int(self.probe.get("failureThreshold") or 3),
        }
        streak, last = 0, None
        while True:
            result = await check(self.probe, self.container, self.run_exec)
            streak = streak + 1 if result == last else 1
            last = result
            if result != self.state and streak >= needed[result]:
                self.state = result
                self.changed(result)
            await asyncio.sleep(period)
