"""Health streams as the 1.37 kubelet opens them: only to plugins listing a
health service, v1 before v1alpha1, never again after UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpcservers
import pytest
from grpc import aio

from kmm.kubelet import emulator, health, nodes, registration
from kmm.kubeletplugin.protos import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2_grpc,
)

DRIVER = "d.example.com"


class _V1(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    async def NodeWatchResources(
        self, request: Any, context: Any
    ) -> AsyncIterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        device = dra_health_v1_pb2.DeviceHealth(
            device=dra_health_v1_pb2.DeviceIdentifier(pool_name="pool", device_name="dev"),
            health=dra_health_v1_pb2.HealthStatus.UNHEALTHY,
            message="from v1",
        )
        yield dra_health_v1_pb2.NodeWatchResourcesResponse(devices=[device])
        await asyncio.Event().wait()  # the stream stays open


class _V1Alpha1(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    async def NodeWatchResources(
        self, request: Any, context: Any
    ) -> AsyncIterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        device = dra_health_v1alpha1_pb2.DeviceHealth(
            device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name="pool", device_name="dev"),
            health=dra_health_v1alpha1_pb2.HealthStatus.HEALTHY,
            message="from v1alpha1",
        )
        yield dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(devices=[device])
        await asyncio.Event().wait()


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kh", dir="/tmp"))  # short: sockets live here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _serve(socket: Path, *servicers: Any) -> aio.Server:
    server = aio.server()
    for servicer in servicers:
        if isinstance(servicer, dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
        else:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
    # The DRA service itself, so that the plugin is a plugin.
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(dra_v1_pb2_grpc.DRAPluginServicer(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def _streams(
    directory: Path, supported: list[str], *servicers: Any
) -> tuple[health.Cache, health.Streams, registration.Registry, aio.Server, list[str]]:
    socket = directory / "dra.sock"
    server = await _serve(socket, *servicers)
    registry = registration.Registry()
    cache = health.Cache(None)
    heard: list[str] = []
    streams = health.Streams(registry, cache, lambda d, _: heard.append(d), retry=0.01)
    registry.register(DRIVER, str(socket), directory / "reg.sock", supported)
    return cache, streams, registry, server, heard


async def _stop(
    streams: health.Streams, registry: registration.Registry, server: aio.Server
) -> None:
    await streams.close()
    await registry.close()
    await grpcservers.stop(server)


async def _eventually(check: Any) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 5 s")


async def test_v1_is_preferred_and_its_message_kept(directory: Path) -> None:
    supported = ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"]
    cache, streams, registry, server, _ = await _streams(directory, supported, _V1(), _V1Alpha1())
    try:
        assert registry.plugin(DRIVER) is not None
        assert registry.plugin(DRIVER).health_service == "v1.DRAResourceHealth"  # type: ignore[union-attr]
        await _eventually(lambda: cache.get(DRIVER, "pool", "dev") != health.UNKNOWN)
        assert cache.read(DRIVER, "pool", "dev") == (health.UNHEALTHY, "from v1")
    finally:
        await _stop(streams, registry, server)


async def test_v1alpha1_is_followed_when_it_is_all_the_plugin_lists(directory: Path) -> None:
    supported = ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
    cache, streams, registry, server, _ = await _streams(directory, supported, _V1Alpha1())
    try:
        await _eventually(lambda: cache.get(DRIVER, "pool", "dev") != health.UNKNOWN)
        assert cache.read(DRIVER, "pool", "dev") == (health.HEALTHY, "from v1alpha1")
    finally:
        await _stop(streams, registry, server)


async def test_a_plugin_listing_no_health_service_gets_no_stream(directory: Path) -> None:
    cache, streams, registry, server, _ = await _streams(directory, ["v1.DRAPlugin"], _V1())
    try:
        await asyncio.sleep(0.2)
        assert registry.plugin(DRIVER).health_service == ""  # type: ignore[union-attr]
        assert streams._running == {}
        assert cache.get(DRIVER, "pool", "dev") == health.UNKNOWN
    finally:
        await _stop(streams, registry, server)


async def test_a_health_service_listed_but_not_served_is_not_asked_again(directory: Path) -> None:
    supported = ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    _, streams, registry, server, heard = await _streams(directory, supported)  # no servicer
    try:
        (task,) = streams._running.values()
        # A retrying stream (every 0.01 s here) would never end.
        await _eventually(task.done)
        assert task.exception() is None
        assert heard == [DRIVER]
    finally:
        await _stop(streams, registry, server)


def test_the_gate_is_on_by_default_as_in_1_36_and_later() -> None:
    options = emulator.Options(node=nodes.NodeSpec("n"), root=Path())
    assert options.resource_health
