"""ResourceClaims as the plugin sees them: ids, raw payloads, safe names.

The kubelet names claims by namespace, name and UID; all three come from
outside and the UID ends up inside CDI device names and file names, so
``validate_ref`` refuses anything but the Kubernetes charsets before any of
them is used. Raw API payloads are ``TypedDict``s (the API server's JSON,
camelCase) - only the fields this library reads are declared.

``claim_configs`` and ``driver_results`` pick this driver's part of an
allocation: results and configs of other drivers in the same claim are
skipped, and class configs come before claim configs (the claim's own
settings are applied last so they win).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal, NewType, NotRequired, TypedDict

from kmm.kubeletplugin import errors

__all__ = [
    "ClaimRef",
    "ClaimUID",
    "DeviceAllocationConfiguration",
    "DeviceRequestAllocationResult",
    "DriverName",
    "NodeName",
    "ResourceClaim",
    "claim_configs",
    "driver_results",
    "validate_ref",
]

ClaimUID = NewType("ClaimUID", str)
NodeName = NewType("NodeName", str)
DriverName = NewType("DriverName", str)


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generateName: str
    labels: dict[str, str]


class OpaqueDeviceConfiguration(TypedDict):
    driver: str
    parameters: Any


class DeviceAllocationConfiguration(TypedDict):
    source: Literal["FromClass", "FromClaim"]
    requests: NotRequired[list[str]]
    opaque: NotRequired[OpaqueDeviceConfiguration]


class DeviceRequestAllocationResult(TypedDict):
    request: str
    driver: str
    pool: str
    device: str


class DeviceAllocationResult(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocationResult
    nodeSelector: dict[str, Any]


class ResourceClaimConsumerReference(TypedDict, total=False):
    apiGroup: str
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumerReference]


class ResourceClaim(TypedDict, total=False):
    """``resource.k8s.io/v1`` ResourceClaim, as the API server sends it."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: ResourceClaimStatus


_UID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in a request."""

    namespace: str
    name: str
    uid: ClaimUID


def validate_ref(ref: ClaimRef) -> None:
    """Raise ``UnsafeClaimError`` unless every part of ``ref`` is a plain k8s name."""
    if not _UID.match(ref.uid):
        raise errors.UnsafeClaimError(f"claim UID {ref.uid!r} is not a valid UID")
    if len(ref.name) > 253 or not _DNS_SUBDOMAIN.match(ref.name):
        raise errors.UnsafeClaimError(f"claim name {ref.name!r} is not a DNS subdomain")
    if len(ref.namespace) > 63 or not _DNS_LABEL.match(ref.namespace):
        raise errors.UnsafeClaimError(f"claim namespace {ref.namespace!r} is not a DNS label")


def ref_of(claim: ResourceClaim) -> ClaimRef:
    """The kubelet-style reference of a claim payload."""
    meta = claim.get("metadata", {})
    return ClaimRef(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=ClaimUID(meta.get("uid", "")),
    )


def driver_results(claim: ResourceClaim, driver: str) -> list[DeviceRequestAllocationResult]:
    """This driver's allocation results, in the claim's order."""
    devices = claim.get("status", {}).get("allocation", {}).get("devices", {})
    return [result for result in devices.get("results", []) if result.get("driver") == driver]


def is_allocated(claim: ResourceClaim) -> bool:
    """Whether the claim carries an allocation at all."""
    return "allocation" in claim.get("status", {})


def claim_configs(claim: ResourceClaim, driver: str) -> list[DeviceAllocationConfiguration]:
    """The device class and claim configs for ``driver``, class configs first."""
    devices = claim.get("status", {}).get("allocation", {}).get("devices", {})
    mine = [
        config
        for config in devices.get("config", [])
        if config.get("opaque", {}).get("driver") == driver
    ]
    from_class = [config for config in mine if config.get("source") == "FromClass"]
    from_claim = [config for config in mine if config.get("source") != "FromClass"]
    return from_class + from_claim
