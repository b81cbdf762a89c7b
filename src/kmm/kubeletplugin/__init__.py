"""A generic DRA kubelet plugin library: registration, the DRA gRPC services,
ResourceSlice publishing, CDI spec files and a checkpoint of prepared claims.

It knows nothing of any device: what exists and what a claim gets is decided
by its owner's ``Policy``. It never imports ``kmm.operator`` or
``kmm.driver``. Modules, one concern each:

- ``plugins``      ``Plugin``: lifecycle, the kubelet's calls, errors
- ``preparing``    ``Preparer``: claims prepared and unprepared, durably
- ``owners``       the ``Owner`` and ``Policy`` protocols and their data
- ``serving``      gRPC servicers and unix-socket servers
- ``publishing``   the ResourceSlice publisher
- ``claimcache``   the ResourceClaim informer (``ClaimCache``, ``StaticClaims``)
- ``claims``       ids, raw claim payloads, ``claim_configs``
- ``cdi``          CDI spec files, ``claim_of_cdi_device``, ``container_claims``
- ``checkpointing`` the two-phase checkpoint: a snapshot and a journal
- ``journaling``   the journal's lines, what a crash leaves of them
- ``files``, ``errors``  atomic writes, the error tree
- ``protos``       generated stubs (``scripts/gen_protos.py``)

API access is ``kmm.kube`` (a ``kube.client.Client``, whose request counter
shows a warm prepare makes no API call); guarded tasks and backoff are
``kmm.aio``'s.

Seed 004's ``ListAttributesSupported`` has no counterpart here: the pinned
1.35 ``resource.k8s.io`` API has scalar device attributes only, so there is
nothing to detect and no policy could use the answer. List-valued attributes
arrive as alpha in 1.36 (KEP-5491, the ``DRAListTypeAttributes`` gate); a
check belongs with the pin that brings them.
"""

from kmm.kubeletplugin.cdi import claim_of_cdi_device, container_claims
from kmm.kubeletplugin.checkpointing import PreparedDevice
from kmm.kubeletplugin.claimcache import ClaimCache, ClaimSource, StaticClaims
from kmm.kubeletplugin.claims import (
    ClaimRef,
    ClaimUID,
    DriverName,
    NodeName,
    ResourceClaim,
    claim_configs,
)
from kmm.kubeletplugin.owners import (
    DeviceAllocation,
    DeviceHealthReport,
    Health,
    Owner,
    Policy,
    PreparingClaim,
)
from kmm.kubeletplugin.plugins import Paths, Plugin, driver_name
from kmm.kubeletplugin.preparing import PrepareResult
from kmm.kubeletplugin.publishing import Device, Publisher

__all__ = [
    "ClaimCache",
    "ClaimRef",
    "ClaimSource",
    "ClaimUID",
    "Device",
    "DeviceAllocation",
    "DeviceHealthReport",
    "DriverName",
    "Health",
    "NodeName",
    "Owner",
    "Paths",
    "Plugin",
    "Policy",
    "PrepareResult",
    "PreparedDevice",
    "PreparingClaim",
    "Publisher",
    "ResourceClaim",
    "StaticClaims",
    "claim_configs",
    "claim_of_cdi_device",
    "container_claims",
    "driver_name",
]
