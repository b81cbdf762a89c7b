"""The emulated kubelet's DRA manager: prepare and unprepare a pod's claims, as 1.37 does.

``Manager.prepare(pod)`` follows ``pkg/kubelet/cm/dra/manager.go``:

1. a validation pass that changes nothing: each of the pod's claims
   (``podclaims.pod_claims``: every pod claim, used by a container or not,
   and the extended resources' claim) named, read from the API server,
   checked to be the pod's own (a template's), reserved for the pod,
   allocated, its drivers' skipped node operations worked out
   (``nodeoperations``), and every driver it must call registered;
2. each claim entered in the cache with the pod's reference, the checkpoint
   written *before* any call; claims already prepared are not sent again,
   and a claim being unprepared is refused ("is being unprepared");
3. one NodePrepareResources per driver with every claim of the pod it has
   to prepare; a per-claim error fails the pod's prepare;
4. each driver's answer *replaces* the devices recorded for that claim and
   driver (1.37's ``resetDevices``: a claim prepared again lists its devices
   once); only when every driver succeeded are the claims marked prepared
   and the checkpoint written.

Pods start concurrently (the kubelet's pod workers), so two pods sharing a
claim may both find it not yet prepared and both send it: drivers must
answer a concurrent second prepare of the same claim.

Errors carry the kubelet's words ("prepare dynamic resources: ..."); the
caller turns them into the ``FailedPrepareDynamicResources`` Event.

``Manager.unprepare(pod_uid)`` works from the cache only (a force-deleted pod
or a deleted claim still unprepares): the pod's reference is dropped, and a
claim no other pod references is marked unpreparing, sent to
NodeUnprepareResources (unless its drivers skip it) and removed from the
cache and the checkpoint once its driver answered. A failed unprepare leaves
it unpreparing, as in the kubelet, until a retry succeeds.

``prepared`` and ``unpreparing`` are memory only, as in the kubelet: a restart
reloads the checkpoint with every claim unprepared, so running pods' claims
are prepared again (drivers must be idempotent).

What the manager keeps of its calls is bounded, since ``kmm kubelet`` runs
for as long as a node does: ``count`` (calls per method and driver, never
reset: what tests count) and ``recent`` (the last ``RECENT_CALLS`` calls
with their claims, for a test's failure message or a debugger).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kmm.kube import client, errors, resources
from kmm.kubelet import checkpoint, nodeoperations, podclaims, registration
from kmm.kubelet import metrics as kubelet_metrics
from kmm.kubeletplugin.protos import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)

__all__ = [
    "RECENT_CALLS",
    "Call",
    "ClaimInfo",
    "Manager",
    "PrepareError",
]

_log = logging.getLogger(__name__)

_STUBS: Mapping[str, tuple[Any, Any]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_CALL_TIMEOUT = 45.0
RECENT_CALLS: Final = 64


@dataclasses.dataclass(frozen=True)
class Call:
    """One NodePrepareResources or NodeUnprepareResources sent to a driver."""

    method: str
    driver: str
    claim_uids: tuple[str, ...]


class PrepareError(Exception):
    """A prepare or unprepare that failed; ``str`` is the kubelet's message."""


@dataclasses.dataclass
class ClaimInfo:
    """One claim in the cache: the checkpointed state plus the memory-only flag."""

    uid: str
    name: str
    namespace: str
    pod_uids: set[str]
    drivers: dict[str, list[checkpoint.Device]]
    # Per driver, the node operations skipped (nodeoperations.skipped).
    skips: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    prepared: bool = False
    # From the moment its last pod's unprepare commits to calling the drivers
    # until it leaves the cache: no new pod may join it (1.37).
    unpreparing: bool = False

    def state(self) -> checkpoint.ClaimState:
        return checkpoint.ClaimState(
            claim_uid=self.uid,
            claim_name=self.name,
            namespace=self.namespace,
            pod_uids=frozenset(self.pod_uids),
            driver_state={d: tuple(devices) for d, devices in self.drivers.items()},
            skip_node_operations=dict(self.skips),
        )

    @classmethod
    def of(cls, state: checkpoint.ClaimState) -> ClaimInfo:
        return cls(
            uid=state.claim_uid,
            name=state.claim_name,
            namespace=state.namespace,
            pod_uids=set(state.pod_uids or ()),
            drivers={d: list(devices) for d, devices in (state.driver_state or {}).items()},
            skips=dict(state.skip_node_operations),
        )

    def calls(self, operation: str) -> list[str]:
        """The drivers ``operation`` is sent to for this claim, sorted."""
        return sorted(
            d for d in self.drivers if not nodeoperations.skips(self.skips.get(d, ()), operation)
        )


def _device(answer: Any) -> checkpoint.Device:
    """A prepared device from a v1 or v1beta1 answer (only v1 has a share id)."""
    has_share = "share_id" in answer.DESCRIPTOR.fields_by_name and answer.HasField("share_id")
    return checkpoint.Device(
        pool_name=answer.pool_name,
        device_name=answer.device_name,
        share_id=answer.share_id if has_share else None,
        request_names=tuple(answer.request_names),
        cdi_device_ids=tuple(answer.cdi_device_ids),
    )


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _is_for_pod(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    uid = _meta(pod).get("uid")
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in _meta(claim).get("ownerReferences") or ()
    )


def _reserved_for(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    uid = _meta(pod).get("uid")
    return any(
        ref.get("resource") == "pods" and ref.get("uid") == uid
        for ref in (claim.get("status") or {}).get("reservedFor") or ()
    )


class Manager:
    """The DRA manager of one emulated node."""

    def __init__(
        self,
        api: client.Client,
        registry: registration.Registry,
        store: checkpoint.Store,
        metrics: kubelet_metrics.Metrics | None = None,
        *,
        optional_node_operations: bool = False,
    ) -> None:
        self.api = api
        # The kubelet's DRAOptionalNodeOperations gate (alpha in 1.37, off).
        self.optional_node_operations = optional_node_operations
        self.registry = registry
        self.store = store
        self.metrics = metrics or kubelet_metrics.Metrics()
        self.claims: dict[tuple[str, str], ClaimInfo] = {}
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.recent: collections.deque[Call] = collections.deque(maxlen=RECENT_CALLS)

    def load(self) -> None:
        """The checkpoint into the cache, every claim unprepared (a restart)."""
        self.claims = {(s.namespace, s.claim_name): ClaimInfo.of(s) for s in self.store.load()}

    def count(self, method: str, driver: str | None = None) -> int:
        """Calls of ``method`` sent so far (to ``driver``, or to any), restarts included."""
        return sum(n for (m, d), n in self._counts.items() if m == method and driver in (None, d))

    def _sync(self) -> None:
        self.store.save([info.state() for info in self.claims.values()])

    async def prepare(self, pod: Mapping[str, Any]) -> None:
        try:
            await self._prepare(pod)
        except PrepareError as err:
            raise PrepareError(f"prepare dynamic resources: {err}") from err

    async def _validate(self, pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], ClaimInfo]]:
        found: list[tuple[Mapping[str, Any], ClaimInfo]] = []
        namespace = str(_meta(pod).get("namespace"))
        for pod_claim in podclaims.pod_claims(pod):
            try:
                name, must_check_owner = podclaims.claim_name(pod, pod_claim)
            except podclaims.UnknownClaim as err:
                raise PrepareError(str(err)) from err
            if name is None:
                continue
            try:
                claim: Mapping[str, Any] = await self.api.request(
                    "GET", resources.RESOURCE_CLAIMS.path(namespace, name)
                )
            except errors.ApiError as err:
                raise PrepareError(f"fetch ResourceClaim {name}: {err.message}") from err
            if must_check_owner and not _is_for_pod(pod, claim):
                raise PrepareError(
                    f"ResourceClaim {namespace}/{name} was not created for pod "
                    f"{namespace}/{_meta(pod).get('name')} (pod is not owner)"
                )
            if not _reserved_for(pod, claim):
                raise PrepareError(
                    f"pod {_meta(pod).get('name')} ({_meta(pod).get('uid')}) is not allowed to "
                    f"use ResourceClaim {name} ({_meta(claim).get('uid')})"
                )
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                raise PrepareError(f"ResourceClaim {name}: not allocated")
            results = (allocation.get("devices") or {}).get("results") or ()
            try:
                skips = nodeoperations.skipped(results, enabled=self.optional_node_operations)
            except nodeoperations.GateDisabled as err:
                raise PrepareError(f"ResourceClaim {name}: {err}") from err
            info = ClaimInfo(
                uid=str(_meta(claim).get("uid")),
                name=name,
                namespace=namespace,
                pod_uids=set(),
                drivers={str(r.get("driver")): [] for r in results},
                skips=skips,
            )
            # A driver needed only for calls it skips need not be there.
            for driver in info.calls(nodeoperations.PREPARE):
                if self.registry.plugin(driver) is None:
                    raise PrepareError(f"DRA driver {driver} is not registered")
            found.append((claim, info))
        return found

    async def _prepare(self, pod: Mapping[str, Any]) -> None:
        validated = await self._validate(pod)
        pod_uid = str(_meta(pod).get("uid"))
        batches: dict[str, list[ClaimInfo]] = {}
        for _claim, fresh in validated:
            key = (fresh.namespace, fresh.name)
            info = self.claims.get(key)
            if info is None:
                info = self.claims[key] = fresh
            elif info.uid != fresh.uid:
                raise PrepareError(
                    f"old ResourceClaim with same name {fresh.name} and different UID "
                    f"{info.uid} still exists (previous pod force-deleted?!)"
                )
            elif info.unpreparing:
                raise PrepareError(f"ResourceClaim {fresh.name} is being unprepared")
            info.pod_uids.add(pod_uid)
            self._sync()
            if info.prepared:
                continue
            for driver in info.calls(nodeoperations.PREPARE):
                batches.setdefault(driver, []).append(info)
        for driver, infos in sorted(batches.items()):
            results = await self._call("NodePrepareResources", driver, infos)
            _check_known("NodePrepareResources", infos, results)
            for info in infos:
                result = results.get(info.uid)
                if result is None:
                    continue
                if result.error:
                    raise PrepareError(
                        f"NodePrepareResources failed for ResourceClaim {info.name}: {result.error}"
                    )
                # The answer replaces what an earlier attempt recorded for
                # this claim and driver (1.37's resetDevices before addDevice):
                # a claim prepared again lists its devices once.
                info.drivers[driver] = [_device(d) for d in result.devices]
            unfinished = len(infos) - len([i for i in infos if i.uid in results])
            if unfinished:
                raise PrepareError(f"NodePrepareResources skipped {unfinished} ResourceClaims")
        for _claim, fresh in validated:
            self.claims[(fresh.namespace, fresh.name)].prepared = True
        self._sync()

    async def _call(
        self, method: str, driver: str, infos: Sequence[ClaimInfo]
    ) -> Mapping[str, Any]:
        plugin = self.registry.plugin(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered")
        pb2, grpc_module = _STUBS[plugin.version]
        stub: Any = grpc_module.DRAPluginStub(plugin.channel)
        claims = [pb2.Claim(namespace=i.namespace, name=i.name, uid=i.uid) for i in infos]
        self._counts[method, driver] += 1
        self.recent.append(Call(method, driver, tuple(i.uid for i in infos)))
        request_type = (
            pb2.NodePrepareResourcesRequest
            if method == "NodePrepareResources"
            else pb2.NodeUnprepareResourcesRequest
        )
        started = time.monotonic()
        try:
            response = await getattr(stub, method)(
                request_type(claims=claims), timeout=_CALL_TIMEOUT
            )
        except Exception as err:  # a gRPC failure of any kind fails this pod's prepare
            self.metrics.observe(method, driver, time.monotonic() - started, ok=False)
            raise PrepareError(f"{method}: {err}") from err
        found: Mapping[str, Any] = response.claims
        ok = not any(answer.error for answer in found.values())
        self.metrics.observe(method, driver, time.monotonic() - started, ok=ok)
        return found

    def pod_claims(self, pod_uid: str) -> list[ClaimInfo]:
        return [info for info in self.claims.values() if pod_uid in info.pod_uids]

    async def unprepare(self, pod_uid: str) -> None:
        """Drop the pod's references; unprepare claims no pod references any more."""
        try:
            await self._unprepare(pod_uid)
        except PrepareError as err:
            raise PrepareError(f"unprepare dynamic resources: {err}") from err

    async def _unprepare(self, pod_uid: str) -> None:
        batches: dict[str, list[ClaimInfo]] = {}
        releasing: list[ClaimInfo] = []
        for info in self.pod_claims(pod_uid):
            if info.pod_uids - {pod_uid}:
                info.pod_uids.discard(pod_uid)
                continue
            info.unpreparing = True
            releasing.append(info)
            for driver in info.calls(nodeoperations.UNPREPARE):
                batches.setdefault(driver, []).append(info)
        for driver, infos in sorted(batches.items()):
            results = await self._call("NodeUnprepareResources", driver, infos)
            _check_known("NodeUnprepareResources", infos, results)
            for info in infos:
                result = results.get(info.uid)
                if result is not None and result.error:
                    raise PrepareError(
                        f"NodeUnprepareResources failed for ResourceClaim {info.name}: {result.error}"
                    )
            unfinished = len(infos) - len([i for i in infos if i.uid in results])
            if unfinished:
                raise PrepareError(f"NodeUnprepareResources skipped {unfinished} ResourceClaims")
        for info in releasing:
            self.claims.pop((info.namespace, info.name), None)
        self._sync()

    def cdi_devices(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
        """The CDI device ids the kubelet would hand the runtime for one
        container (``GetResources``): those of the claims and requests it
        names, and of the extended resources it requests that DRA backs."""
        try:
            requests = podclaims.container_requests(pod, container)
        except podclaims.UnknownClaim:
            return []
        found: list[str] = []
        namespace = str(_meta(pod).get("namespace"))
        for name, names in requests.items():
            info = self.claims.get((namespace, name))
            if info is None:
                continue
            for request in names:
                found.extend(_cdi_ids(info, request))
        return found


def _cdi_ids(info: ClaimInfo, request: str) -> list[str]:
    """``cdiDevicesAsList``: a device recorded without request names serves every request."""
    return [
        cdi_id
        for devices in info.drivers.values()
        for device in devices
        if not request or not device.request_names or request in device.request_names
        for cdi_id in device.cdi_device_ids or ()
    ]


def _check_known(method: str, infos: Sequence[ClaimInfo], results: Mapping[str, Any]) -> None:
    """An answer about a claim that was not asked fails the call, as in the kubelet."""
    asked = {i.uid for i in infos}
    for uid in results:
        if uid not in asked:
            raise PrepareError(f"{method} returned result for unknown claim UID {uid}")
