"""The seams between the plugin and the code around it: ``Owner`` and ``Policy``.

``Owner`` is whoever runs the plugin (``kmm.driver``'s node driver): the
plugin takes its lock for every kubelet request, calls its commit hooks
once per claim, and asks it to shut down when it cannot go on. ``Policy``
decides everything about devices - which exist, what a claim gets, what the
container sees, whether they are healthy - so the plugin never reads a
device's attributes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from kmm.kubeletplugin import cdi, checkpointing, claims, publishing

__all__ = [
    "DeviceAllocation",
    "DeviceHealthReport",
    "Health",
    "Owner",
    "Policy",
    "PreparingClaim",
]


class Owner(Protocol):
    """What the plugin needs from whoever owns it."""

    @property
    def lock(self) -> asyncio.Lock:
        """Taken for every kubelet request. ``Plugin.stop`` must not be called holding it:
        a request in flight holds it and ``stop`` waits for that request."""
        ...

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        """Commit what the policy just prepared for ``claim``; called under the lock.

        Raising fails that claim (the plugin then undoes its prepare)."""
        ...

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        """Commit what the policy just released for ``claim``; called under the lock.

        Also called for a claim whose prepare was interrupted by a crash
        (``claim_allocated`` may not have run for it): it must be idempotent."""
        ...

    def request_shutdown(self, reason: str) -> None:
        """Ask the owner to shut down (the plugin cannot recover).

        It runs in the very task whose failure it reports, and ``stop`` waits
        for that task: it must return and leave stopping to the shutdown it
        triggers, never stop the plugin itself."""
        ...


@dataclasses.dataclass(frozen=True)
class DeviceAllocation:
    """What the policy prepared for one allocation result of a claim."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    edits: cdi.ContainerEdits


@dataclasses.dataclass(frozen=True)
class PreparingClaim:
    """A claim to prepare, reduced to this driver's part of its allocation."""

    ref: claims.ClaimRef
    results: tuple[claims.DeviceRequestAllocationResult, ...]
    configs: tuple[claims.DeviceAllocationConfiguration, ...]


class Health(enum.IntEnum):
    """The kubelet's ``HealthStatus`` values."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclasses.dataclass(frozen=True)
class DeviceHealthReport:
    pool_name: str
    device_name: str
    health: Health
    message: str = ""
    last_updated: int = 0
    timeout_seconds: int = 0


class Policy(Protocol):
    """Device semantics, behind one interface."""

    @property
    def name(self) -> str:
        """The policy's name; ``driver_name(policy)`` derives the driver from it."""
        ...

    def devices(self) -> Sequence[publishing.Device]:
        """The devices to publish on this node, in the pool named after the node."""
        ...

    async def prepare(self, claim: PreparingClaim) -> Sequence[DeviceAllocation]:
        """Allocate the claim's devices, one ``DeviceAllocation`` per result.

        Idempotent per claim UID: preparing a prepared claim again answers the
        same. Raise to fail this claim alone. What it changes on the node
        must not outlive a reboot (device state, files under ``/run``): the
        plugin records claims without fsyncs and, after a reboot, restores
        none of those prepared before it (``plugins``). A policy that changes
        something a reboot keeps must keep its own durable record of it."""
        ...

    async def unprepare(self, uid: claims.ClaimUID) -> None:
        """Release what ``prepare`` allocated for ``uid``; unknown UIDs are a no-op."""
        ...

    def restore(
        self, prepared: Mapping[claims.ClaimUID, Sequence[checkpointing.PreparedDevice]]
    ) -> None:
        """Relearn, at start, what the checkpoint says is prepared in this boot."""
        ...

    def health_supported(self) -> bool:
        """Whether ``watch_health`` is served; if not, the kubelet is told so and stops asking."""
        ...

    def watch_health(self) -> AsyncIterator[Sequence[DeviceHealthReport]]:
        """A stream of health reports (every device, each time)."""
        ...
