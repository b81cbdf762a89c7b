"""The informers of device taints: ResourceSlices and kmm's DeviceTaintRules.

``DeviceInformers`` makes the two informers ``devicecaches`` describes and
maps their events back to Modules (a slice to the Modules naming its
driver, a rule to the Module its labels name), for ``wiring``. They run
only where the API server serves DeviceTaintRules: ``wiring.Operator.run``
asks discovery (``served_versions``), ``deviceapis.taint_rules_version``
decides, and ``start`` points the rule informer at that version
(``DeferredListWatch``: the informer, and the handlers on it, exist before
the version is known). Elsewhere neither runs, nothing is listed, and
upgrades go on without taints.

Limits: no planning; reads only (the writes are ``taintrules``').
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from kmm.kube import client, listwatch, resources
from kmm.operator import caches, deviceapis, devicecaches, inflight
from kmm.runtime import handlers, informers, stores

__all__ = ["DeferredListWatch", "DeviceInformers", "Served", "served_versions"]


class Served(Protocol):
    """Discovery of one API version: the resource names it serves (none
    when the server does not serve that version)."""

    async def __call__(self, api_version: str, stop: asyncio.Event) -> set[str]: ...


async def served_versions(served: Served, stop: asyncio.Event) -> dict[str, set[str]]:
    """What each of ``deviceapis.VERSIONS`` of resource.k8s.io serves."""
    return {
        version: await served(f"{deviceapis.GROUP}/{version}", stop)
        for version in deviceapis.VERSIONS
    }


class DeferredListWatch:
    """A ``ListWatch`` of a resource whose version is chosen later (``choose``)."""

    def __init__(self, api: client.Client, *, kind: str) -> None:
        self._api = api
        self.kind = kind
        self._inner: listwatch.ApiListWatch | None = None

    def choose(self, resource: resources.Resource) -> None:
        self._inner = listwatch.ApiListWatch(self._api, resource, kind=self.kind)

    def _chosen(self) -> listwatch.ApiListWatch:
        if self._inner is None:
            raise RuntimeError(f"{self.kind}: listed before its API version was chosen")
        return self._inner

    async def list_page(
        self,
        *,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        continue_token: str | None,
    ) -> listwatch.ListPage:
        return await self._chosen().list_page(
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_token=continue_token,
        )

    def watch(
        self,
        *,
        resource_version: str,
        label_selector: str | None,
        field_selector: str | None,
        timeout_seconds: int,
    ) -> AsyncGenerator[listwatch.WatchEvent, None]:
        return self._chosen().watch(
            resource_version=resource_version,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
        )


class DeviceInformers:
    """The slice and rule informers, their events mapped to Modules."""

    def __init__(
        self,
        api: client.Client,
        *,
        modules_store: stores.Store,
        pending: inflight.Pending,
        requeueing: Callable[[informers.Informer, informers.Handler], None],
        enqueue: handlers.Enqueue,
        handler_errors: informers.HandlerErrors | None = None,
        page_size: int = 500,
    ) -> None:
        self.slices = informers.Informer(
            "resourceslices",
            listwatch.ApiListWatch(api, resources.RESOURCE_SLICES, kind="ResourceSlice"),
            handler_errors=handler_errors,
            projection=devicecaches.project_slice,
            indexers={devicecaches.DRIVER_INDEX: devicecaches.slice_driver_index},
            page_size=page_size,
        )
        self._rules_source = DeferredListWatch(api, kind="DeviceTaintRule")
        self.rules = informers.Informer(
            "devicetaintrules",
            self._rules_source,
            handler_errors=handler_errors,
            label_selector=devicecaches.RULE_SELECTOR,
            projection=devicecaches.project_rule,
            indexers={caches.MODULE_INDEX: caches.object_module_index},
        )
        requeueing(
            self.slices,
            handlers.enqueue_mapped(
                enqueue, lambda found: devicecaches.modules_of_slice(found, modules_store)
            ),
        )
        pending.follow(self.rules, inflight.RULE_PREFIX)
        requeueing(self.rules, handlers.enqueue_mapped(enqueue, caches.object_module_index))

    def start(self, version: str) -> tuple[informers.Informer, ...]:
        """Point the rule informer at ``version``; the informers to run."""
        self._rules_source.choose(deviceapis.rules_resource(version))
        return (self.slices, self.rules)
