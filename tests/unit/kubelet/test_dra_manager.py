"""The DRA manager's pure parts (which claim a pod claim names, and which are
used), and what it keeps of its calls to a driver on a real unix socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpcservers
import pytest
from grpc import aio

from kmm.kube import client
from kmm.kubelet import checkpoint, dra, registration
from kmm.kubeletplugin.protos import dra_v1_pb2, dra_v1_pb2_grpc

DRIVER = "d.example.com"


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "templated", "resourceClaimTemplateName": "t"},
                {"name": "unused", "resourceClaimName": "other"},
            ],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "templated"}]}}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "direct"}]}}],
        },
        "status": status,
    }


def test_a_named_claim_is_taken_as_is_and_a_templates_from_the_status() -> None:
    pod = _pod(resourceClaimStatuses=[{"name": "templated", "resourceClaimName": "p-templated-x"}])
    claims = pod["spec"]["resourceClaims"]
    assert dra.claim_name(pod, claims[0]) == ("shared", False)
    assert dra.claim_name(pod, claims[1]) == ("p-templated-x", True)


def test_a_templates_claim_not_made_yet_fails_the_prepare() -> None:
    pod = _pod()
    with pytest.raises(dra.PrepareError, match="unable to find ResourceClaim"):
        dra.claim_name(pod, pod["spec"]["resourceClaims"][1])


def test_claims_no_container_names_are_not_used() -> None:
    pod = _pod()
    assert dra.uses_claim(pod, "direct")
    assert dra.uses_claim(pod, "templated")  # an init container counts
    assert not dra.uses_claim(pod, "unused")


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
