"""The gRPC services the kubelet calls, and their unix-socket servers.

- ``Registration`` (package ``pluginregistration``) on the registration
  socket in the kubelet's plugin registry: ``GetInfo`` and
  ``NotifyRegistrationStatus``.
- ``DRAPlugin`` v1 and v1beta1 (same messages; v1beta1 has no ``share_id``)
  and, when the policy serves it, ``DRAResourceHealth`` v1 and v1alpha1 (the
  same messages: a 1.37 kubelet uses v1, 1.35 and 1.36 only know v1alpha1),
  all on the DRA socket in the plugin's data directory.

Servicers only translate protobuf to the plugin's calls (``Handler``) and
back: the claim logic lives in ``plugins`` and ``preparing``. ``Server`` owns one
``grpc.aio`` server bound to one unix socket: a stale socket is removed
before binding, the socket is made owner-only before it appears at its path,
and it is removed on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import types
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, cast

import grpc
from grpc import aio

from kmm.kubeletplugin import checkpointing, claims, errors, owners
from kmm.kubeletplugin.protos import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

__all__ = ["MAX_SOCKET_PATH", "Handler", "Server", "add_dra_services", "add_registration_service"]

logger = logging.getLogger(__name__)

Context = aio.ServicerContext[Any, Any]


class PrepareAnswer(Protocol):
    @property
    def devices(self) -> Sequence[checkpointing.PreparedDevice]: ...

    @property
    def error(self) -> str: ...


class Handler(Protocol):
    """What the servicers call; implemented by ``plugins.Plugin``."""

    driver: claims.DriverName

    def plugin_info(self) -> tuple[str, list[str]]:
        """The DRA endpoint and the supported versions, for ``GetInfo``."""
        ...

    def registration_status(self, registered: bool, error: str) -> None: ...

    async def node_prepare(
        self, refs: Sequence[claims.ClaimRef]
    ) -> Mapping[str, PrepareAnswer]: ...

    async def node_unprepare(self, refs: Sequence[claims.ClaimRef]) -> Mapping[str, str]: ...

    def health_supported(self) -> bool: ...

    def watch_health(self) -> AsyncIterator[Sequence[owners.DeviceHealthReport]]: ...


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: Context
    ) -> pluginregistration_pb2.PluginInfo:
        endpoint, versions = self._handler.plugin_info()
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self._handler.driver,
            endpoint=endpoint,
            supported_versions=versions,
        )

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: Context
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self._handler.registration_status(request.plugin_registered, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


def _refs(request_claims: Sequence[Any]) -> list[claims.ClaimRef]:
    return [
        claims.ClaimRef(namespace=c.namespace, name=c.name, uid=claims.ClaimUID(c.uid))
        for c in request_claims
    ]


def _names(refs: Sequence[claims.ClaimRef]) -> str:
    return " ".join(f"{r.namespace}/{r.name}" for r in refs)


class _DRA:
    """One servicer for both DRA versions: v1 and v1beta1 declare the same
    messages (v1beta1 lacks ``share_id``, which we never set), so only the
    module holding the message classes differs."""

    def __init__(self, handler: Handler, messages: types.ModuleType) -> None:
        self._handler = handler
        self._messages = messages

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        refs = _refs(request.claims)
        if logger.isEnabledFor(logging.DEBUG):  # the list costs more than the call's bookkeeping
            logger.debug("NodePrepareResources: %s", _names(refs))
        answers = await self._handler.node_prepare(refs)
        response = self._messages.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            entry.error = answer.error
            for device in answer.devices:
                entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        refs = _refs(request.claims)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("NodeUnprepareResources: %s", _names(refs))
        answers = await self._handler.node_unprepare(refs)
        response = self._messages.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response


class _Health:
    """One servicer for both health versions: v1 (Kubernetes 1.37) declares
    v1alpha1's messages in another package, so only the module holding the
    message classes differs."""

    def __init__(
        self, handler: Handler, stopping: asyncio.Event, messages: types.ModuleType
    ) -> None:
        self._handler = handler
        self._stopping = stopping
        self._messages = messages

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        if not self._handler.health_supported():
            # UNIMPLEMENTED tells the kubelet to stop asking.
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "device health is not reported")
        reports = self._handler.watch_health()
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                following = asyncio.ensure_future(anext(reports))
                done, _ = await asyncio.wait(
                    {following, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    following.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await following
                    return
                try:
                    batch = following.result()
                except StopAsyncIteration:
                    return
                yield _health_response(self._messages, batch)
        finally:
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
            aclose = getattr(reports, "aclose", None)
            if aclose is not None:
                await aclose()


def _health_response(messages: types.ModuleType, batch: Sequence[owners.DeviceHealthReport]) -> Any:
    response = messages.NodeWatchResourcesResponse()
    for report in batch:
        response.devices.add(
            device=messages.DeviceIdentifier(
                pool_name=report.pool_name, device_name=report.device_name
            ),
            health=int(report.health),
            last_updated_time=report.last_updated,
            health_check_timeout_seconds=report.timeout_seconds,
            message=report.message,
        )
    return response


def add_registration_service(server: aio.Server, handler: Handler) -> None:
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(_Registration(handler), server)


def add_dra_services(
    server: aio.Server, handler: Handler, *, stopping: asyncio.Event, health: bool
) -> None:
    # The generated adders only look the methods up by name; the casts say so.
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
        cast("dra_v1_pb2_grpc.DRAPluginServicer", _DRA(handler, dra_v1_pb2)), server
    )
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        cast("dra_v1beta1_pb2_grpc.DRAPluginServicer", _DRA(handler, dra_v1beta1_pb2)), server
    )
    if health:
        dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            cast(
                "dra_health_v1_pb2_grpc.DRAResourceHealthServicer",
                _Health(handler, stopping, dra_health_v1_pb2),
            ),
            server,
        )
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            cast(
                "dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer",
                _Health(handler, stopping, dra_health_v1alpha1_pb2),
            ),
            server,
        )


# sockaddr_un.sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


class Server:
    """One ``grpc.aio`` server on one owner-only unix socket."""

    def __init__(self, socket: pathlib.Path) -> None:
        self.socket = socket
        self.server: aio.Server = aio.server()

    async def start(self) -> None:
        """Serve on the socket; it appears at its path only once serving and private.

        The kubelet's plugin watcher reacts to the file's creation, so the
        server binds a temporary name, starts, restricts the permissions and
        only then renames the socket into place: nobody can connect before it
        answers, or while it is still world-accessible.
        """
        staging = self.socket.with_name(f".{self.socket.name}.tmp")
        longest = max(len(str(staging.absolute())), len(str(self.socket.absolute())))
        if longest > MAX_SOCKET_PATH:
            raise errors.FatalError(
                f"cannot serve on {self.socket}: unix socket paths allow {MAX_SOCKET_PATH} "
                f"characters and this one (staged as {staging.name}) takes {longest}; "
                "use a shorter --root or driver name"
            )
        for stale in (self.socket, staging):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()  # left by a previous run that did not exit cleanly
        self.server.add_insecure_port(f"unix://{staging}")
        await self.server.start()
        os.chmod(staging, 0o600)
        os.replace(staging, self.socket)

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, wait up to ``grace`` for those in flight, remove the socket."""
        await self.server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
