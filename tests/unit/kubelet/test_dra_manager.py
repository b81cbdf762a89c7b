"""The DRA manager against a driver on a real unix socket and a fake API server:
what 1.37 changed (devices replaced, a claim being unprepared refused, every
pod claim and the extended resources' claim prepared, skipped node
operations), and what it keeps of its calls."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import grpcservers
import pytest
from grpc import aio

from kmm.kube import client
from kmm.kubelet import checkpoint, dra, registration
from kmm.kubeletplugin.protos import dra_v1_pb2, dra_v1_pb2_grpc

DRIVER = "d.example.com"


def test_claim_info_round_trips_through_the_checkpoint_unprepared() -> None:
    state = checkpoint.ClaimState(
        claim_uid="u",
        claim_name="c",
        namespace="ns",
        pod_uids=frozenset({"a", "b"}),
        driver_state={"d.example.com": (checkpoint.Device("pool", "dev", None, ("r",), ("x=y",)),)},
    )
    info = dra.ClaimInfo.of(state)
    assert not info.prepared
    assert info.state() == state


class _Driver(dra_v1_pb2_grpc.DRAPluginServicer):
    """Unprepares every claim it is sent."""

    async def NodeUnprepareResources(
        self, request: Any, context: Any
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        return dra_v1_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_v1_pb2.NodeUnprepareResourceResponse() for c in request.claims}
        )


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))  # short: sockets live here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_the_call_log_is_bounded_and_the_counts_keep_counting(directory: Path) -> None:
    server = aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_Driver(), server)
    socket = directory / "dra.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    registry = registration.Registry()
    # Unprepare works from the cache: no API call, so no API server.
    manager = dra.Manager(cast(client.Client, None), registry, checkpoint.Store(directory))
    try:
        registry.register(DRIVER, str(socket), directory / "reg.sock", ["v1.DRAPlugin"])
        calls = 3 * dra.RECENT_CALLS
        for i in range(calls):
            manager.claims["ns", f"c{i}"] = dra.ClaimInfo(
                uid=f"u{i}", name=f"c{i}", namespace="ns", pod_uids={"pod"}, drivers={DRIVER: []}
            )
            await manager.unprepare("pod")
        assert manager.claims == {}
        assert manager.count("NodeUnprepareResources") == calls
        assert manager.count("NodeUnprepareResources", DRIVER) == calls
        assert manager.count("NodeUnprepareResources", "other.example.com") == 0
        assert manager.count("NodePrepareResources") == 0
        assert len(manager.recent) == dra.RECENT_CALLS
        assert manager.recent[-1] == dra.Call("NodeUnprepareResources", DRIVER, (f"u{calls - 1}",))
    finally:
        await registry.close()
        await grpcservers.stop(server)


class _Api:
    """The API server's ResourceClaims, by name."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert method == "GET"
        return self.claims[path.rsplit("/", 1)[-1]]


def _claim(name: str, *pods: str, skip: list[str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": "pool", "device": "dev"}
    if skip is not None:
        result["skipNodeOperations"] = skip
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "status": {
            "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in pods],
            "allocation": {"devices": {"results": [result]}},
        },
    }


def _pod(uid: str, *claims: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            # No container names the claims: they are prepared all the same.
            "containers": [{"name": "main"}],
        },
        "status": status,
    }


class _Preparer(dra_v1_pb2_grpc.DRAPluginServicer):
    """Prepares every claim with one device; unprepares once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.unpreparing = asyncio.Event()
        self.extra_uid: str | None = None

    async def NodePrepareResources(
        self, request: Any, context: Any
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        answers = {
            c.uid: dra_v1_pb2.NodePrepareResourceResponse(
                devices=[
                    dra_v1_pb2.Device(
                        request_names=["r"],
                        pool_name="pool",
                        device_name="dev",
                        cdi_device_ids=[f"{DRIVER}/dev={c.uid}"],
                    )
                ]
            )
            for c in request.claims
        }
        if self.extra_uid is not None:
            answers[self.extra_uid] = dra_v1_pb2.NodePrepareResourceResponse()
        return dra_v1_pb2.NodePrepareResourcesResponse(claims=answers)

    async def NodeUnprepareResources(
        self, request: Any, context: Any
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        self.unpreparing.set()
        await self.release.wait()
        return dra_v1_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_v1_pb2.NodeUnprepareResourceResponse() for c in request.claims}
        )


@contextlib.asynccontextmanager
async def _manager(
    directory: Path, api: _Api, *, optional_node_operations: bool = False
) -> AsyncIterator[tuple[dra.Manager, _Preparer]]:
    server = aio.server()
    driver = _Preparer()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(driver, server)
    socket = directory / "dra.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    registry = registration.Registry()
    manager = dra.Manager(
        cast(client.Client, api),
        registry,
        checkpoint.Store(directory),
        optional_node_operations=optional_node_operations,
    )
    try:
        registry.register(DRIVER, str(socket), directory / "reg.sock", ["v1.DRAPlugin"])
        yield manager, driver
    finally:
        driver.release.set()
        await registry.close()
        await grpcservers.stop(server)


async def test_a_claim_prepared_again_lists_its_devices_once(directory: Path) -> None:
    async with _manager(directory, _Api(_claim("c", "a"))) as (manager, _):
        await manager.prepare(_pod("a", "c"))
        manager.load()  # a restart: every claim unprepared, prepared again below
        await manager.prepare(_pod("a", "c"))
        assert manager.count("NodePrepareResources") == 2
        (state,) = manager.store.load()
        assert state.driver_state == {
            DRIVER: (checkpoint.Device("pool", "dev", None, ("r",), (f"{DRIVER}/dev=uid-c",)),)
        }


async def test_a_claim_being_unprepared_takes_no_new_pod(directory: Path) -> None:
    async with _manager(directory, _Api(_claim("c", "a", "b"))) as (manager, driver):
        await manager.prepare(_pod("a", "c"))
        driver.release.clear()
        releasing = asyncio.ensure_future(manager.unprepare("a"))
        await driver.unpreparing.wait()
        with pytest.raises(dra.PrepareError) as caught:
            await manager.prepare(_pod("b", "c"))
        assert str(caught.value) == "prepare dynamic resources: ResourceClaim c is being unprepared"
        driver.release.set()
        await releasing
        assert manager.claims == {}
        await manager.prepare(_pod("b", "c"))  # a new claim info, prepared afresh
        assert manager.count("NodePrepareResources") == 2


async def test_unused_claims_and_the_extended_resources_claim_are_prepared(
    directory: Path,
) -> None:
    api = _Api(_claim("c", "a"), _claim("ext", "a"))
    async with _manager(directory, api) as (manager, _):
        pod = _pod("a", "c", extendedResourceClaimStatus={"resourceClaimName": "ext"})
        await manager.prepare(pod)
        assert manager.recent[-1] == dra.Call("NodePrepareResources", DRIVER, ("uid-c", "uid-ext"))
        assert set(manager.claims) == {("ns", "c"), ("ns", "ext")}


async def test_an_answer_for_a_claim_not_asked_fails_the_prepare(directory: Path) -> None:
    async with _manager(directory, _Api(_claim("c", "a"))) as (manager, driver):
        driver.extra_uid = "stranger"
        with pytest.raises(
            dra.PrepareError, match="returned result for unknown claim UID stranger"
        ):
            await manager.prepare(_pod("a", "c"))


async def test_skipped_node_operations_need_the_gate(directory: Path) -> None:
    async with _manager(directory, _Api(_claim("c", "a", skip=["*"]))) as (manager, _):
        with pytest.raises(dra.PrepareError) as caught:
            await manager.prepare(_pod("a", "c"))
        assert str(caught.value) == (
            "prepare dynamic resources: ResourceClaim c: "
            "DRAOptionalNodeOperations feature gate is disabled on kubelet"
        )
        assert manager.claims == {}


async def test_with_the_gate_skipped_operations_are_not_sent(directory: Path) -> None:
    api = _Api(_claim("c", "a", skip=["*"]))
    async with _manager(directory, api, optional_node_operations=True) as (manager, _):
        await manager.prepare(_pod("a", "c"))
        assert manager.count("NodePrepareResources") == 0
        (state,) = manager.store.load()
        assert state.skip_node_operations == {DRIVER: ("*",)}
        assert manager.claims["ns", "c"].prepared
        await manager.unprepare("a")
        assert manager.count("NodeUnprepareResources") == 0
        assert manager.claims == {}
        assert manager.store.load() == []
