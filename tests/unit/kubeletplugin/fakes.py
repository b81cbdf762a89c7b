"""Test doubles for the plugin's seams: an owner, a policy, claims, a root dir."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from kmm.kubeletplugin import checkpointing, claims, owners, publishing

DRIVER = "test.example.com"
NODE = "node-a"


class FakeOwner:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.allocated: list[claims.ClaimRef] = []
        self.released: list[claims.ClaimRef] = []
        self.shutdowns: list[str] = []
        self.fail_allocated: set[str] = set()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        if claim.uid in self.fail_allocated:
            raise RuntimeError(f"commit of {claim.uid} failed")
        self.allocated.append(claim)

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        self.released.append(claim)

    def request_shutdown(self, reason: str) -> None:
        self.shutdowns.append(reason)


class FakePolicy:
    """Gives each result a device node named after the device; can block or fail."""

    name = "fake"

    def __init__(self, *, health: bool = False) -> None:
        self.prepared: dict[claims.ClaimUID, list[owners.DeviceAllocation]] = {}
        self.prepare_calls = 0
        self.unprepare_calls = 0
        self.restored: dict[claims.ClaimUID, list[str]] = {}
        self.fail: set[str] = set()
        self.fail_unprepare: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self._health = health
        self.health_queue: asyncio.Queue[list[owners.DeviceHealthReport]] = asyncio.Queue()

    @property
    def policy_name(self) -> str:
        return self.name

    def devices(self) -> Sequence[publishing.Device]:
        return [{"name": "dev0"}]

    async def prepare(self, claim: owners.PreparingClaim) -> Sequence[owners.DeviceAllocation]:
        self.prepare_calls += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if claim.ref.uid in self.fail:
            raise RuntimeError(f"policy refuses {claim.ref.uid}")
        allocations = [
            owners.DeviceAllocation(
                request_names=(result["request"],),
                pool_name=result["pool"],
                device_name=result["device"],
                edits={"deviceNodes": [{"path": f"/dev/{result['device']}"}]},
            )
            for result in claim.results
        ]
        self.prepared[claim.ref.uid] = allocations
        return allocations

    async def unprepare(self, uid: claims.ClaimUID) -> None:
        self.unprepare_calls += 1
        if uid in self.fail_unprepare:
            raise RuntimeError(f"policy cannot release {uid}")
        self.prepared.pop(uid, None)

    def restore(
        self, prepared: Mapping[claims.ClaimUID, Sequence[checkpointing.PreparedDevice]]
    ) -> None:
        self.restored = {uid: [d.device_name for d in devs] for uid, devs in prepared.items()}

    def health_supported(self) -> bool:
        return self._health

    async def watch_health(self) -> AsyncIterator[Sequence[owners.DeviceHealthReport]]:
        while True:
            yield await self.health_queue.get()


def make_claim(
    name: str = "claim",
    *,
    namespace: str = "default",
    uid: str | None = None,
    devices: Sequence[str] = ("dev0",),
    driver: str = DRIVER,
    extra_results: Sequence[dict[str, str]] = (),
    configs: Sequence[dict[str, Any]] = (),
    resource_version: str = "1",
) -> claims.ResourceClaim:
    results: list[Any] = [
        {"request": f"req{i}", "driver": driver, "pool": NODE, "device": device}
        for i, device in enumerate(devices)
    ]
    results.extend(extra_results)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": resource_version,
        },
        "status": {"allocation": {"devices": {"results": results, "config": list(configs)}}},
    }
