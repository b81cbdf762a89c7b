"""Informer against a scripted HTTP server: list, watch, bookmarks, 410, reconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kmm.aio import clocks
from kmm.kube import listwatch, reflecting, resources
from kmm.runtime import informers, stores

from . import helpers, wire
from .wire import event, obj, page

CONFIGMAPS = resources.Resource("", "v1", "configmaps")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (kind, key, resourceVersion)

    def on_add(self, o: stores.RawObject) -> None:
        self.events.append(("add", stores.key_of(o), o["metadata"]["resourceVersion"]))

    def on_update(self, old: stores.RawObject, new: stores.RawObject) -> None:
        self.events.append(("update", stores.key_of(new), new["metadata"]["resourceVersion"]))

    def on_delete(self, o: stores.RawObject) -> None:
        self.events.append(("delete", stores.key_of(o), o["metadata"]["resourceVersion"]))


@pytest.fixture
async def conn() -> AsyncIterator[wire.Connection]:
    async for connection in wire.connect():
        yield connection


@contextlib.asynccontextmanager
async def running(informer: informers.Informer) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(informer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


def make(
    conn: wire.Connection, clock: clocks.FakeClock | None = None, **kwargs: Any
) -> tuple[informers.Informer, Recorder]:
    source = listwatch.ApiListWatch(conn.api, CONFIGMAPS, namespace="ns")
    informer = informers.Informer("cm", source, clock=clock or clocks.FakeClock(), **kwargs)
    recorder = Recorder()
    informer.add_handler(recorder)
    return informer, recorder


async def test_lists_in_pages_then_watches_from_the_list_version(conn: wire.Connection) -> None:
    server = conn.server
    server.lists.append((200, page([obj("a", "5")], "10", continue_token="tok")))
    server.lists.append((200, page([obj("b", "7")], "11")))
    informer, recorder = make(
        conn,
        label_selector="app=x",
        field_selector="metadata.name!=z",
        page_size=1,
        watch_timeout=123,
    )
    async with running(informer):
        await informer.wait_synced()
        await server.wait_until(lambda: len(server.watch_requests()) == 1)
    assert informer.has_synced()
    first, second = server.list_requests()
    assert first.path == "/api/v1/namespaces/ns/configmaps"
    selectors = {"labelSelector": "app=x", "fieldSelector": "metadata.name!=z"}
    assert first.query == {"limit": "1", **selectors}
    assert second.query == {"limit": "1", "continue": "tok", **selectors}
    (watch,) = server.watch_requests()
    assert watch.query == {
        "watch": "true",
        "resourceVersion": "11",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "123",
        **selectors,
    }
    assert sorted(recorder.events) == [("add", "ns/a", "5"), ("add", "ns/b", "7")]


async def test_watch_events_update_store_and_handlers(conn: wire.Connection) -> None:
    server = conn.server
    server.lists.append((200, page([obj("a", "5")], "10")))
    server.watches.append(
        wire.Watch(
            lines=[
                event("ADDED", obj("b", "11", data={"k": "v"})),
                event("MODIFIED", obj("a", "12", data={"k": "changed"})),
                event("MODIFIED", obj("a", "13", data={"k": "changed"})),  # a heartbeat
                event("DELETED", obj("b", "14")),
            ]
        )
    )
    informer, recorder = make(conn)
    async with running(informer):
        await helpers.settle(lambda: informer.resource_version == "14")
    assert recorder.events == [
        ("add", "ns/a", "5"),
        ("add", "ns/b", "11"),
        ("update", "ns/a", "12"),
        # a's "13" changed nothing but its version: stored, not handed on
        ("delete", "ns/b", "11"),  # the last state the store knew
    ]
    assert [o["metadata"]["name"] for o in informer.store.objects()] == ["a"]
    assert informer.store.get("ns/a")["metadata"]["resourceVersion"] == "13"


async def test_bookmark_moves_the_version_and_a_closed_watch_resumes_from_it(
    conn: wire.Connection,
) -> None:
    server = conn.server
    server.lists.append((200, page([], "10")))
    bookmark = event("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "42"}})
    server.watches.append(wire.Watch(lines=[bookmark], end="close"))
    informer, recorder = make(conn)
    async with running(informer):
        await server.wait_until(lambda: len(server.watch_requests()) == 2)
    assert [r.query["resourceVersion"] for r in server.watch_requests()] == ["10", "42"]
    assert informer.lists == 1
    assert recorder.events == []


@pytest.mark.parametrize("form", ["error-event", "http-status"])
async def test_gone_relists_and_reports_the_difference(conn: wire.Connection, form: str) -> None:
    server = conn.server
    server.lists.append((200, page([obj("a", "5"), obj("b", "6")], "10")))
    if form == "error-event":
        server.watches.append(wire.Watch(lines=[event("ERROR", wire.status(410))]))
    else:
        server.watches.append(wire.Watch(status=410))
    server.lists.append((200, page([obj("a", "5"), obj("c", "20")], "30")))
    informer, recorder = make(conn)
    listed: list[tuple[str, list[str]]] = []
    informer.add_relist_hook(lambda rv: listed.append((rv, sorted(informer.store.list_keys()))))
    async with running(informer):
        await server.wait_until(lambda: len(server.watch_requests()) == 2)
    assert informer.lists == 2
    assert [r.query["resourceVersion"] for r in server.watch_requests()] == ["10", "30"]
    assert recorder.events[2:] == [("delete", "ns/b", "6"), ("add", "ns/c", "20")]
    # Each list's version, told once the store holds the list.
    assert listed == [("10", ["ns/a", "ns/b"]), ("30", ["ns/a", "ns/c"])]
    assert sorted(informer.store.list_keys()) == ["ns/a", "ns/c"]
    assert informer.relists == {reflecting.START: 1, reflecting.GONE: 1}


async def test_an_expired_continue_token_lists_again_in_one_request(
    conn: wire.Connection,
) -> None:
    server = conn.server
    server.lists.append((200, page([obj("a", "5")], "10", continue_token="tok")))
    server.lists.append((410, wire.status(410)))  # compaction passed version 10
    server.lists.append((200, page([obj("a", "5"), obj("b", "12")], "20")))
    informer, recorder = make(conn, page_size=1)
    async with running(informer):
        await informer.wait_synced()
        await server.wait_until(lambda: len(server.watch_requests()) == 1)
    first, second, whole = server.list_requests()
    assert first.query == {"limit": "1"}
    assert second.query == {"limit": "1", "continue": "tok"}
    assert whole.query == {}  # no limit, no token: one consistent answer
    assert server.watch_requests()[0].query["resourceVersion"] == "20"
    assert sorted(recorder.events) == [("add", "ns/a", "5"), ("add", "ns/b", "12")]
    assert informer.lists == 1
    assert informer.relists == {reflecting.START: 1}


async def test_dropped_connection_backs_off_then_resumes(conn: wire.Connection) -> None:
    server = conn.server
    clock = clocks.FakeClock()
    server.lists.append((200, page([], "10")))
    server.watches.append(wire.Watch(lines=[event("ADDED", obj("a", "11"))], end="drop"))
    server.watches.append(wire.Watch(status=500))
    informer, _ = make(conn, clock, initial_backoff=1.0, max_backoff=60.0)
    async with running(informer):
        await helpers.settle(lambda: clock.pending == 1)
        assert len(server.watch_requests()) == 1
        clock.advance(1.0)
        await server.wait_until(lambda: len(server.watch_requests()) == 2)
        # The 500 doubles the backoff.
        await helpers.settle(lambda: clock.pending == 1)
        clock.advance(1.999)
        assert clock.pending == 1
        clock.advance(0.001)
        await server.wait_until(lambda: len(server.watch_requests()) == 3)
    assert [r.query["resourceVersion"] for r in server.watch_requests()] == ["10", "11", "11"]
    assert informer.lists == 1


async def test_failed_list_is_retried_with_backoff(conn: wire.Connection) -> None:
    server = conn.server
    clock = clocks.FakeClock()
    server.lists.append((503, wire.status(503, "ServiceUnavailable")))
    server.lists.append((200, page([obj("a", "1")], "2")))
    informer, _ = make(conn, clock)
    async with running(informer):
        await helpers.settle(lambda: clock.pending == 1)
        assert not informer.has_synced()
        clock.advance(informer.reflector.delays.initial)
        await informer.wait_synced()
    assert informer.lists == 2
    assert informer.relists == {reflecting.START: 1}  # completed lists only


async def test_projection_and_indexes(conn: wire.Connection) -> None:
    server = conn.server
    big = obj(
        "n1",
        "5",
        metadata={"labels": {"zone": "z1"}, "managedFields": [{"manager": "x"}]},
        spec={"nodeName": "node-1", "other": "x" * 1000},
        status={"phase": "Running"},
    )
    server.lists.append((200, page([big], "10")))
    server.watches.append(
        wire.Watch(lines=[event("MODIFIED", obj("n1", "11", metadata={"labels": {"zone": "z2"}}))])
    )
    informer, _ = make(
        conn,
        projection=stores.keep_fields("metadata.labels", "spec.nodeName"),
        indexers={"zone": stores.by_label("zone"), "node": stores.by_path("spec.nodeName")},
    )
    async with running(informer):
        await informer.wait_synced()
        assert informer.store.get("ns/n1") == {
            "metadata": {
                "name": "n1",
                "namespace": "ns",
                "resourceVersion": "5",
                "labels": {"zone": "z1"},
            },
            "spec": {"nodeName": "node-1"},
        }
        assert [o["metadata"]["name"] for o in informer.store.by_index("node", "node-1")] == ["n1"]
        await helpers.settle(lambda: informer.resource_version == "11")
    assert informer.store.by_index("zone", "z1") == []
    assert informer.store.index_keys("zone", "z2") == ["ns/n1"]
    assert informer.store.by_index("node", "node-1") == []


async def test_custom_resources_cluster_scoped(conn: wire.Connection) -> None:
    server = conn.server
    server.lists.append((200, page([obj("m", "3", namespace="")], "4")))
    things = resources.Resource("example.com", "v1", "things", namespaced=False)
    source = listwatch.ApiListWatch(conn.api, things)
    informer = informers.Informer("things", source, clock=clocks.FakeClock())
    async with running(informer):
        await server.wait_until(lambda: len(server.watch_requests()) == 1)
    assert server.requests[0].path == "/apis/example.com/v1/things"
    assert informer.store.list_keys() == ["m"]
    assert server.watch_requests()[0].query["allowWatchBookmarks"] == "true"


class Failures:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def handler_failed(self, informer: str, method: str) -> None:
        self.calls.append((informer, method))


async def test_handler_failure_does_not_stop_the_informer_and_is_counted(
    conn: wire.Connection,
) -> None:
    server = conn.server
    server.lists.append((200, page([obj("a", "1")], "2")))
    server.watches.append(
        wire.Watch(
            lines=[event("ADDED", obj("b", "3")), event("MODIFIED", obj("b", "4", data={"k": "v"}))]
        )
    )
    failures = Failures()
    informer, recorder = make(conn, handler_errors=failures)

    def explode(_: stores.RawObject) -> None:
        raise RuntimeError("handler bug")

    informer._handlers.insert(0, informers.FuncHandler(add=explode))
    async with running(informer):
        await helpers.settle(lambda: informer.resource_version == "4")
    assert [e[1] for e in recorder.events] == ["ns/a", "ns/b", "ns/b"]
    # Both adds (from the list and from the watch) failed; the update had no
    # failing handler. Every failure is told, none is dropped.
    assert failures.calls == [("cm", "on_add"), ("cm", "on_add")]


async def test_a_watch_closed_without_events_backs_off_instead_of_spinning(
    conn: wire.Connection,
) -> None:
    server = conn.server
    clock = clocks.FakeClock()
    server.lists.append((200, page([], "10")))
    server.watches.append(wire.Watch(end="close"))
    informer, _ = make(conn, clock, initial_backoff=1.0)
    async with running(informer):
        await helpers.settle(lambda: clock.pending == 1)
        assert len(server.watch_requests()) == 1
        clock.advance(1.0)
        await server.wait_until(lambda: len(server.watch_requests()) == 2)
    assert [r.query["resourceVersion"] for r in server.watch_requests()] == ["10", "10"]
