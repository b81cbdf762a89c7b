"""The whole runtime on the wire: manager, informer, controller, write counting.

A reconciler that labels ConfigMaps converges with exactly one write, and a
resync of the converged state (every key reconciled again) writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kmm.aio import clocks
from kmm.kube import client, listwatch, resources
from kmm.runtime import controllers, handlers, informers, manager, stores, workqueue

from . import helpers, wire
from .wire import event, obj, page

CONFIGMAPS = resources.Resource("", "v1", "configmaps")


class Labeller:
    def __init__(self, store: stores.Store, api: client.Client) -> None:
        self.store = store
        self.api = api

    async def reconcile(self, key: str) -> controllers.Result:
        current = self.store.get(key)
        if current is None:
            return controllers.Result()
        if current["metadata"].get("labels", {}).get("seen") == "yes":
            return controllers.Result()  # converged: no write
        namespace, name = stores.split_key(key)
        patch = {"metadata": {"labels": {"seen": "yes"}}}
        await self.api.request(
            "PATCH", CONFIGMAPS.path(namespace, name), body=patch, content_type=client.MERGE_PATCH
        )
        return controllers.Result()


class Count:
    def __init__(self) -> None:
        self.reconciles = 0

    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        assert outcome == "success"
        self.reconciles += 1

    def queue_depth(self, controller: str, depth: int) -> None:
        pass


@pytest.fixture
async def conn() -> AsyncIterator[wire.Connection]:
    async for connection in wire.connect():
        yield connection


async def test_converges_with_one_write_and_a_resync_writes_nothing(
    conn: wire.Connection,
) -> None:
    server = conn.server
    counter = conn.api.counter
    patched = asyncio.Event()
    server.lists.append(
        (200, page([obj("a", "1"), obj("b", "2", metadata={"labels": {"seen": "yes"}})], "10"))
    )
    labelled = obj("a", "11", metadata={"labels": {"seen": "yes"}})
    server.watches.append(wire.Watch(lines=[event("MODIFIED", labelled)], gate=patched))

    clock = clocks.FakeClock()
    informer = informers.Informer(
        "cm",
        listwatch.ApiListWatch(conn.api, CONFIGMAPS, namespace="ns"),
        projection=stores.keep_fields("metadata.labels"),
        clock=clock,
    )
    count = Count()
    controller = controllers.Controller(
        "labeller",
        Labeller(informer.store, conn.api),
        queue=workqueue.WorkQueue("labeller", clock),
        metrics=count,
        clock=clock,
    )
    informer.add_handler(handlers.enqueue_object(controller.enqueue))
    mgr = manager.Manager()
    mgr.add_informer(informer)
    mgr.add_controller(controller)
    stop = asyncio.Event()
    run = asyncio.ensure_future(mgr.run(stop))
    try:
        await server.wait_until(lambda: len(server.writes) == 1)
        patched.set()
        # a (patched), b (already converged), a again after its MODIFIED event.
        await helpers.settle(lambda: count.reconciles == 3)
        assert counter.writes == {("PATCH", "configmaps"): 1}
        assert server.writes == [
            (
                "PATCH",
                "/api/v1/namespaces/ns/configmaps/a",
                {"metadata": {"labels": {"seen": "yes"}}},
            )
        ]

        for key in informer.store.list_keys():  # a resync of the converged state
            controller.enqueue(key)
        await helpers.settle(lambda: count.reconciles == 5)
        assert counter.total_writes == 1
    finally:
        stop.set()
        await run
