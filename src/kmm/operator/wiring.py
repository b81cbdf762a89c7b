"""Assembling the operator: informers, the Module controller, the manager.

``Operator`` wires the caches (``caches``) to the controller through
``runtime.handlers`` (each event mapped back to the Modules it concerns),
hands the same events to ``writing.Pending`` (the cache caught up with a
write), and puts everything under one ``runtime.manager.Manager``: informers
on every replica, the controller only on the leader. ``running`` adds the
HTTP endpoints and the process lifecycle around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from kmm.api import modules
from kmm.kube import client, listwatch, objects, resources
from kmm.operator import caches, reconciler, writing
from kmm.runtime import controllers, handlers, informers, leaderelection, manager, stores

__all__ = ["Counting", "Election", "Operator"]

# List pages of Nodes and pods: a page of 500 real Nodes parses to ~20 MiB of
# dicts before projection, and the allocator keeps much of that peak around
# the cached objects; 25 per page cuts the resident cost of caching 5,000
# Nodes from ~15 to ~6 MiB (bench/bench_operator.py) for 180 more list
# requests at start.
LIST_PAGE = 25


@dataclasses.dataclass(frozen=True)
class Election:
    """Lease settings; client-go's defaults."""

    identity: str
    namespace: str
    name: str = "kmm-operator"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Counting:
    """A reconciler wrapper counting reconciles in flight and done, for idleness."""

    def __init__(self, inner: controllers.Reconciler) -> None:
        self.inner = inner
        self.in_flight = 0
        self.done = 0

    async def reconcile(self, key: str) -> controllers.Result:
        self.in_flight += 1
        try:
            return await self.inner.reconcile(key)
        finally:
            self.in_flight -= 1
            self.done += 1


def _seen(pending: writing.Pending) -> informers.FuncHandler:
    version = objects.resource_version
    return informers.FuncHandler(
        add=lambda obj: pending.seen(stores.key_of(obj), version(obj)),
        update=lambda _old, new: pending.seen(stores.key_of(new), version(new)),
        delete=lambda obj: pending.seen(stores.key_of(obj), None),
    )


class Operator:
    def __init__(
        self,
        api: client.Client,
        *,
        election: Election | None = None,
        metrics: controllers.Metrics | None = None,
        workers: int = 4,
        instance: str = "kmm-operator",
    ) -> None:
        self.pending = writing.Pending()
        self.writer = writing.Writer(api, pending=self.pending)
        self.modules = informers.Informer(
            "modules",
            listwatch.ApiListWatch(api, writing.MODULES, kind=modules.KIND),
            indexers={caches.SELECTOR_INDEX: caches.module_selector_index},
        )
        self.daemonsets = informers.Informer(
            "daemonsets",
            listwatch.ApiListWatch(api, resources.DAEMONSETS, kind="DaemonSet"),
            label_selector=caches.OWNED_SELECTOR,
            projection=stores.keep_fields(*caches.DAEMONSET_FIELDS),
            indexers={caches.MODULE_INDEX: caches.object_module_index},
        )
        self.pods = informers.Informer(
            "pods",
            listwatch.ApiListWatch(api, resources.PODS, kind="Pod"),
            label_selector=caches.OWNED_SELECTOR,
            projection=stores.keep_fields(*caches.POD_FIELDS),
            indexers={caches.MODULE_INDEX: caches.object_module_index},
            page_size=LIST_PAGE,
        )
        self.nodes = informers.Informer(
            "nodes",
            listwatch.ApiListWatch(api, resources.NODES, kind="Node"),
            projection=stores.keep_fields(*caches.NODE_FIELDS),
            indexers={caches.MODULE_INDEX: caches.node_module_index},
            page_size=LIST_PAGE,
        )
        self.reconciler = reconciler.ModuleReconciler(
            reconciler.Caches(
                modules=self.modules.store,
                daemonsets=self.daemonsets.store,
                pods=self.pods.store,
                nodes=self.nodes.store,
            ),
            self.writer,
            instance=instance,
        )
        self.counting = Counting(self.reconciler)
        self.controller = controllers.Controller(
            "module", self.counting, workers=workers, metrics=metrics
        )
        enqueue = self.controller.enqueue
        modules_store = self.modules.store

        def owner(obj: stores.RawObject) -> list[str]:
            key = caches.module_of_object(obj)
            return [key] if key else []

        # Pending first: a reconcile the event triggers must see it cleared.
        self.modules.add_handler(_seen(self.pending))
        self.modules.add_handler(handlers.enqueue_object(enqueue))
        self.daemonsets.add_handler(_seen(self.pending))
        self.daemonsets.add_handler(handlers.enqueue_mapped(enqueue, owner))
        self.pods.add_handler(handlers.enqueue_mapped(enqueue, owner))
        self.nodes.add_handler(_seen(self.pending))
        self.nodes.add_handler(
            handlers.enqueue_mapped(
                enqueue, lambda node: caches.modules_of_node(node, modules_store)
            )
        )

        self.elector: leaderelection.LeaderElector | None = None
        if election is not None:
            self.elector = leaderelection.LeaderElector(
                leaderelection.ApiLeases(api),
                election.identity,
                namespace=election.namespace,
                name=election.name,
                lease_duration=election.lease_duration,
                renew_deadline=election.renew_deadline,
                retry_period=election.retry_period,
            )
        self.manager = manager.Manager(elector=self.elector)
        for informer in (self.modules, self.daemonsets, self.pods, self.nodes):
            self.manager.add_informer(informer)
        self.manager.add_controller(self.controller)

    def leading(self) -> bool:
        if self.elector is None:
            return self.manager.started_leading.is_set()
        return self.elector.is_leader()

    def cached(self) -> dict[str, int]:
        return {
            informer.name: len(informer.store)
            for informer in (self.modules, self.daemonsets, self.pods, self.nodes)
        }

    def idle(self) -> bool:
        """Nothing queued, delayed or running (tests wait for this, then count writes)."""
        queue = self.controller.queue
        return len(queue) == 0 and queue.delayed == 0 and self.counting.in_flight == 0

    def resync(self) -> None:
        """Enqueue every Module, as a periodic resync would."""
        for key in self.modules.store.list_keys():
            self.controller.enqueue(key)

    async def run(self, stop: asyncio.Event) -> None:
        await self.manager.run(stop)

    def describe(self) -> dict[str, Any]:
        return {
            "cached": self.cached(),
            "leading": self.leading(),
            "reconciles": self.counting.done,
        }
