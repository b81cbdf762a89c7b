"""The plugin's claim informer and prepare path against a real API server.

A ResourceClaim is created and given an allocation through its status (the
scheduler's part, done by hand so the test does not depend on it); a test
client playing the kubelet prepares it over the real unix socket. With the
informer warm, preparing costs no API request.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubeletplugin import (
    checkpointing,
    claimcache,
    claims,
    owners,
    plugins,
    publishing,
)
from kmm.sandbox import testing

pytestmark = pytest.mark.integration

DRIVER = "claims-it.example.com"


class Owner:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.shutdowns: list[str] = []

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        return None

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        return None

    def request_shutdown(self, reason: str) -> None:
        self.shutdowns.append(reason)


class Policy:
    name = "it"

    def devices(self) -> list[publishing.Device]:
        return [{"name": "dev0"}]

    async def prepare(self, claim: owners.PreparingClaim) -> list[owners.DeviceAllocation]:
        return [
            owners.DeviceAllocation((r["request"],), r["pool"], r["device"], {"env": ["X=1"]})
            for r in claim.results
        ]

    async def unprepare(self, uid: claims.ClaimUID) -> None:
        return None

    def restore(self, prepared: Any) -> None:
        return None

    def health_supported(self) -> bool:
        return False

    async def watch_health(self) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="ki", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_prepare_from_a_warm_informer(
    sandbox: testing.RunningSandbox,
    kmm_api: kube_client.Client,
    namespace: str,
    root: pathlib.Path,
) -> None:
    from grpc import aio

    from kmm.kubeletplugin.protos import dra_v1_pb2, dra_v1_pb2_grpc

    node = sandbox.node_names[0]
    api = kmm_api
    base = resources.RESOURCE_CLAIMS.path(namespace)
    name = f"claim-{uuid.uuid4().hex[:6]}"
    created = await api.request(
        "POST",
        base,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "req0", "exactly": {"deviceClassName": "x"}}]}
            },
        },
    )
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "req0", "driver": DRIVER, "pool": node, "device": "dev0"},
                    {"request": "req0", "driver": "other.example.com", "pool": node, "device": "o"},
                ]
            }
        }
    }
    await api.request("PUT", f"{base}/{name}/status", body=created)
    uid = created["metadata"]["uid"]

    owner = Owner()
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: owner.shutdowns.append(str(e)))
    plugin = plugins.Plugin(
        DRIVER,
        node=node,
        owner=owner,
        policy=Policy(),
        claim_source=cache,
        paths=plugins.Paths.under(root, DRIVER),
    )
    await plugin.start()
    plugin.allow_claims()
    channel = aio.insecure_channel(f"unix://{plugin.paths.dra_socket}")
    try:
        for _ in range(600):
            cached = cache.cached(namespace, name)
            if cached is not None and claims.is_allocated(cached):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the informer never saw the allocated claim")
        before = api.counter.total
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=namespace, name=name, uid=uid)]
        )
        response = await stub.NodePrepareResources(request, timeout=45)
        answer = response.claims[uid]
        assert answer.error == ""
        assert [(d.pool_name, d.device_name) for d in answer.devices] == [(node, "dev0")]
        assert api.counter.total == before
        assert plugin.prepared()[claims.ClaimUID(uid)].state == checkpointing.COMPLETED
    finally:
        await channel.close()
        await plugin.stop()
    assert owner.shutdowns == []
