"""The operator's writes on the wire: what each sends, and no repeat while in flight.

Against a scripted HTTP server (``scripted``) answering as the API server
would; the in-flight memory (``writing.Pending``) is what is under test.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import kubeclients
import pytest
from scripted import Server

from kmm.operator import writing


def node(rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": rv, "labels": labels}}


@pytest.fixture
async def writer() -> AsyncIterator[tuple[writing.Writer, Server]]:
    async with Server() as server, kubeclients.for_server(server.url, max_attempts=1) as api:
        yield writing.Writer(api), server


async def test_a_label_patch_is_not_repeated_until_the_cache_shows_it(
    writer: tuple[writing.Writer, Server],
) -> None:
    write, server = writer
    server.script((200, node("11", ready="")), (200, node("12")))
    change: dict[str, str | None] = {"ready": ""}
    await write.patch_node_labels(node("10"), change)
    # The cache still shows version 10: a reconcile in that gap sends nothing.
    await write.patch_node_labels(node("10"), change)
    assert len(server.seen) == 1
    sent = server.seen[0]
    assert (sent.method, sent.path) == ("PATCH", "/api/v1/nodes/n1")
    assert sent.headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(sent.body) == {"metadata": {"labels": {"ready": ""}}}
    write.pending.seen("n1", "11")  # the cache caught up: a new need is a new write
    await write.patch_node_labels(node("11", ready=""), {"ready": None})
    assert len(server.seen) == 2


async def test_apply_tells_a_create_and_delete_a_missing_daemonset(
    writer: tuple[writing.Writer, Server],
) -> None:
    write, server = writer
    desired = {"metadata": {"name": "ds", "namespace": "ns"}, "spec": {}}
    gone = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "gone"}
    server.script((201, {"metadata": {"resourceVersion": "5"}}), (404, gone))
    assert await write.apply_daemonset(desired, None) is True
    assert not await write.delete_daemonset("ns", "other", {})
    apply, delete = server.seen
    assert apply.query == {"fieldManager": "kmm", "force": "true"}
    assert apply.headers["Content-Type"] == "application/apply-patch+yaml"
    assert (delete.method, delete.query) == ("DELETE", {"propagationPolicy": "Background"})
    # The same desired state while the cache still shows the old version: no second apply.
    server.script((200, {"metadata": {"resourceVersion": "9"}}))
    observed = {"metadata": {"name": "ds", "namespace": "ns", "resourceVersion": "8"}}
    assert await write.apply_daemonset(desired, observed) is False
    assert await write.apply_daemonset(desired, observed) is False
    assert len(server.seen) == 3


async def test_status_patches_go_to_the_subresource_and_events_are_best_effort(
    writer: tuple[writing.Writer, Server],
) -> None:
    write, server = writer
    module = {"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "3"}}
    server.script((200, {"metadata": {"resourceVersion": "4"}}), (500, b"boom"))
    await write.patch_module_status(module, {"status": {"observedGeneration": 1}})
    await write.create_event({"metadata": {"namespace": "ns"}, "reason": "X"})  # no raise
    status, event = server.seen
    assert status.path == "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/ns/modules/m/status"
    assert (event.method, event.path) == ("POST", "/api/v1/namespaces/ns/events")
