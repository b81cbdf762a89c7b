"""Publishing this node's devices as ``resource.k8s.io/v1`` ResourceSlices.

One pool per node, named after the node; the devices are cut into slices of
at most 128 (the API's limit), all carrying the pool's ``generation`` and
``resourceSliceCount``. A sync compares what is wanted with what the API
server holds for this node and driver:

- the newest generation matches exactly and nothing older is left: no write
  at all (an unchanged slice is never rewritten);
- it matches but older generations linger: only those are deleted;
- anything else: every slice is created anew under generation + 1, then the
  older generations are deleted. Schedulers ignore a pool whose newest
  generation is incomplete and never mix generations, so creating first and
  deleting after never shows a half-published pool as complete.

``Publisher.run`` syncs whenever ``publish`` changes the devices, and
whenever one of the pool's slices is deleted or changed by someone else: it
watches them. The kubelet wipes a node's slices when it starts and when a
driver stays away longer than its delay; without the watch a driver that
outlived (or came back after) that wipe would never publish again. A failed
sync is reported through ``on_error`` (``PublishError`` is recoverable) and
retried with exponential backoff. Device contents are opaque here: they come
from the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from kmm.aio import backoff, tasks
from kmm.kube import client, listwatch, reflecting, resources
from kmm.kube import errors as kube_errors
from kmm.kubeletplugin import claims, errors

__all__ = ["MAX_DEVICES_PER_SLICE", "Device", "Publisher", "SyncResult"]

logger = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128
_SLICES = resources.RESOURCE_SLICES


class DeviceAttribute(TypedDict, total=False):
    int: int
    bool: bool
    string: str
    version: str


class DeviceCapacity(TypedDict):
    value: str


class Device(TypedDict):
    """``resource.k8s.io/v1`` Device as published in a slice."""

    name: str
    attributes: NotRequired[dict[str, DeviceAttribute]]
    capacity: NotRequired[dict[str, DeviceCapacity]]


class SyncResult(TypedDict):
    created: int
    deleted: int
    generation: int


def _matches(wanted: Any, actual: Any) -> bool:
    """Whether ``actual`` carries everything in ``wanted`` (server defaults ignored)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _matches(value, actual[key]) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(_matches(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    return bool(wanted == actual)


def chunks(devices: Sequence[Device]) -> list[list[Device]]:
    """The devices cut into slices; an empty device list still makes one slice."""
    if not devices:
        return [[]]
    return [
        list(devices[i : i + MAX_DEVICES_PER_SLICE])
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ]


class Publisher:
    """Keeps this node's ResourceSlices equal to the published devices."""

    def __init__(
        self,
        api: client.Client,
        *,
        driver: claims.DriverName,
        node: claims.NodeName,
        on_error: tasks.ErrorHandler,
        delays: backoff.Backoff | None = None,
    ) -> None:
        self._api = api
        self._driver = driver
        self._node = node
        self._on_error = on_error
        self._delays = delays or backoff.Backoff(initial=0.25, maximum=60.0)
        self._devices: list[Device] = []
        self._changed = asyncio.Event()
        self._changed.set()
        self.syncs = 0
        # Changes to the pool's slices seen on the watch (someone's deletion
        # or edit, a relist), and how many of them the last completed sync
        # had seen when it began: once ``synced_changes`` reaches a value
        # ``changes`` had, everything the watch showed until then is acted on.
        self.changes = 0
        self.synced_changes = 0
        self.in_sync = asyncio.Event()
        self._owner_ref: dict[str, Any] | None = None
        self._owner_looked_up = False
        self._watch_slices = reflecting.Reflector(
            "resourceslices",
            listwatch.ApiListWatch(api, _SLICES),
            self,
            field_selector=f"spec.nodeName={node},spec.driver={driver}",
            watch_timeout=240,
            on_retry=lambda err: self._on_error(
                errors.PublishError(str(err)), "watching ResourceSlices"
            ),
        )

    def publish(self, devices: Sequence[Device]) -> None:
        """Replace the devices to publish; the running loop picks them up."""
        self._devices = list(devices)
        self.in_sync.clear()
        self._changed.set()

    async def run(self) -> None:
        """Sync on every change, retrying failures with backoff; runs until cancelled."""
        watching = tasks.guard(
            self._watch_slices.run(), name="resourceslice-watch", on_error=self._on_error
        )
        try:
            await self._sync_loop()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    # The watch's sink: a slice of the pool deleted or changed (the kubelet's
    # wipe, someone's edit), or a relist (events may have been missed).
    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        del items, resource_version
        self.changes += 1
        self._changed.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] in ("DELETED", "MODIFIED"):
            self.changes += 1
            self._changed.set()

    async def _sync_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            seen = self.changes
            try:
                await self.sync()
            except kube_errors.ApiError as err:
                # A conflict (a slice name taken, a pool rewritten under us)
                # heals on the next pass like an outage does.
                heals = err.retriable or isinstance(err, kube_errors.Conflict)
                wrapped: errors.PluginError = (
                    errors.PublishError(str(err)) if heals else errors.FatalError(str(err))
                )
                self._on_error(wrapped, "publishing ResourceSlices")
                if not heals:
                    return
                await asyncio.sleep(self._delays.next())
                self._changed.set()
            else:
                self._delays.reset()
                self.synced_changes = seen
                if not self._changed.is_set():
                    self.in_sync.set()

    def _slice(self, devices: list[Device], *, generation: int, count: int) -> dict[str, Any]:
        prefix = f"{self._node}-{self._driver}"[:200].rstrip("-.") + "-"
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": prefix,
                **({"ownerReferences": [self._owner_ref]} if self._owner_ref else {}),
            },
            "spec": {
                "driver": self._driver,
                "nodeName": self._node,
                "pool": {
                    "name": self._node,
                    "generation": generation,
                    "resourceSliceCount": count,
                },
                "devices": devices,
            },
        }

    async def _node_owner(self) -> None:
        # Owned by the Node, slices go with it when the node is deleted (as the
        # Go helper does); looked up once, and optional: without it (no such
        # node, no RBAC to read nodes) slices are simply not garbage-collected.
        if self._owner_looked_up:
            return
        try:
            node = await self._api.request("GET", resources.NODES.path(name=self._node))
        except kube_errors.ApiError as err:
            if err.retriable:
                raise
            logger.info("slices get no owner: cannot read node %s (%s)", self._node, err)
        else:
            self._owner_ref = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self._node,
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        self._owner_looked_up = True

    async def list_slices(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self._node},spec.driver={self._driver}"
        listing = await self._api.request("GET", _SLICES.path(), query={"fieldSelector": selector})
        items: list[dict[str, Any]] = listing.get("items", [])
        return [s for s in items if s.get("spec", {}).get("pool", {}).get("name") == self._node]

    async def sync(self) -> SyncResult:
        """One pass: make the API server's slices match the devices; at most one generation's writes."""
        self.syncs += 1
        wanted = chunks(self._devices)
        existing = await self.list_slices()
        newest = max((s["spec"]["pool"]["generation"] for s in existing), default=0)
        current = [s for s in existing if s["spec"]["pool"]["generation"] == newest]
        older = [s for s in existing if s["spec"]["pool"]["generation"] != newest]
        created = 0
        if not (existing and self._equal(current, wanted)):
            await self._node_owner()
            newest += 1
            for devices in wanted:
                body = self._slice(devices, generation=newest, count=len(wanted))
                await self._api.request("POST", _SLICES.path(), body=body)
                created += 1
            older = existing
        for stale in older:
            await self._delete(stale["metadata"]["name"])
        return {"created": created, "deleted": len(older), "generation": newest}

    def _equal(self, current: list[dict[str, Any]], wanted: list[list[Device]]) -> bool:
        if len(current) != len(wanted):
            return False
        if any(s["spec"]["pool"].get("resourceSliceCount") != len(wanted) for s in current):
            return False
        unmatched = list(current)
        for devices in wanted:
            for candidate in unmatched:
                if _matches(devices, candidate["spec"].get("devices", [])):
                    unmatched.remove(candidate)
                    break
            else:
                return False
        return True

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(kube_errors.NotFound):  # already gone: what we wanted
            await self._api.request("DELETE", _SLICES.path(name=name))

    async def delete_all(self) -> int:
        """Remove every slice of this node's pool (used when DRA is turned off)."""
        existing = await self.list_slices()
        for stale in existing:
            await self._delete(stale["metadata"]["name"])
        return len(existing)
