"""A test client playing the kubelet, using the generated stubs as any client would."""

from __future__ import annotations

import pathlib
from types import TracebackType
from typing import Any

from grpc import aio

from kmm.kubeletplugin import claims
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

VERSIONS: dict[str, tuple[Any, Any]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_VERSIONS: dict[str, tuple[Any, Any]] = {
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}


class Kubelet:
    def __init__(self, registration_socket: pathlib.Path) -> None:
        self._registration_socket = registration_socket
        self._channels: list[aio.Channel] = []

    async def __aenter__(self) -> Kubelet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for channel in self._channels:
            await channel.close()

    def _channel(self, socket: str | pathlib.Path) -> aio.Channel:
        # A private subchannel pool, as each kubelet process has: gRPC otherwise
        # shares connections per target across channels in this process, and a
        # test that restarts a plugin would be handed the dead one's connection.
        channel = aio.insecure_channel(
            f"unix://{socket}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self._channels.append(channel)
        return channel

    async def get_info(self) -> pluginregistration_pb2.PluginInfo:
        stub = pluginregistration_pb2_grpc.RegistrationStub(
            self._channel(self._registration_socket)
        )
        return await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)

    async def notify(self, registered: bool, error: str = "") -> None:
        stub = pluginregistration_pb2_grpc.RegistrationStub(
            self._channel(self._registration_socket)
        )
        await stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=5,
        )

    async def _endpoint(self) -> str:
        return (await self.get_info()).endpoint

    async def prepare(
        self, *refs: claims.ClaimRef | claims.ResourceClaim, version: str = "v1"
    ) -> dict[str, Any]:
        pb2, grpc_mod = VERSIONS[version]
        stub = grpc_mod.DRAPluginStub(self._channel(await self._endpoint()))
        request = pb2.NodePrepareResourcesRequest(claims=[_claim(pb2, r) for r in refs])
        response = await stub.NodePrepareResources(request, timeout=45)
        return dict(response.claims)

    async def unprepare(
        self, *refs: claims.ClaimRef | claims.ResourceClaim, version: str = "v1"
    ) -> dict[str, str]:
        pb2, grpc_mod = VERSIONS[version]
        stub = grpc_mod.DRAPluginStub(self._channel(await self._endpoint()))
        request = pb2.NodeUnprepareResourcesRequest(claims=[_claim(pb2, r) for r in refs])
        response = await stub.NodeUnprepareResources(request, timeout=45)
        return {uid: answer.error for uid, answer in response.claims.items()}

    def health(self, endpoint: str, version: str = "v1alpha1") -> Any:
        pb2, grpc_mod = HEALTH_VERSIONS[version]
        stub = grpc_mod.DRAResourceHealthStub(self._channel(endpoint))
        return stub.NodeWatchResources(pb2.NodeWatchResourcesRequest())


def _claim(pb2: Any, ref: claims.ClaimRef | claims.ResourceClaim) -> Any:
    if not isinstance(ref, claims.ClaimRef):
        ref = claims.ref_of(ref)
    return pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


def devices_of(answer: Any) -> list[tuple[str, str, list[str], list[str]]]:
    return [
        (d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids))
        for d in answer.devices
    ]
