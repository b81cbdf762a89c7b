"""The operator's writes on the wire: what each sends, and no repeat while in flight.

Against a scripted HTTP server (``scripted``) answering as the API server
would; the in-flight memory (``inflight.Pending``) is what is under test.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any, Unpack

import kubeclients
import operator_fixtures as fixtures
import pytest
from scripted import Server

from kmm.kube import client, errors, listwatch, resources
from kmm.operator import caches, inflight, reconciler, views, writing
from kmm.runtime import informers, stores


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
    other = {"metadata": {"name": "other", "namespace": "ns", "uid": "u-other"}}
    assert not await write.delete_daemonset(other)
    apply, delete = server.seen
    assert apply.query == {"fieldManager": "kmm", "force": "true"}
    assert apply.headers["Content-Type"] == "application/apply-patch+yaml"
    assert (delete.method, delete.path) == (
        "DELETE",
        "/apis/apps/v1/namespaces/ns/daemonsets/other",
    )
    assert json.loads(delete.body) == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Background",
        "preconditions": {"uid": "u-other"},
    }
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


async def test_a_refusal_in_the_cache_gap_writes_one_status_and_one_event(
    writer: tuple[writing.Writer, Server],
) -> None:
    """Two reconciles of an invalid Module before the cache shows the first
    status write, a second apart: the conditions differ only in their
    transition times, so the second sends neither the status nor the Event."""
    write, server = writer
    cached = views.Caches(
        modules=stores.Store(), daemonsets=stores.Store(), pods=stores.Store(), nodes=stores.Store()
    )
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["containerImage"] = "r.io/x"
    cached.modules.put(raw)
    ticks = itertools.count()
    rec = reconciler.ModuleReconciler(
        cached, write, now=lambda: f"2026-01-01T00:00:{next(ticks):02d}Z"
    )
    server.script((200, {"metadata": {"resourceVersion": "11"}}), (201, {}))
    await rec.reconcile("ns/m")
    await rec.reconcile("ns/m")  # the cache still shows resourceVersion 10
    assert [(s.method, s.path.rsplit("/", 1)[-1]) for s in server.seen] == [
        ("PATCH", "status"),
        ("POST", "events"),
    ]
    # A new refusal (the user changed the spec) is a new write and a new Event.
    server.script((200, {"metadata": {"resourceVersion": "13"}}), (201, {}))
    changed = {**raw, "metadata": {**raw["metadata"], "resourceVersion": "12", "generation": 2}}
    changed["spec"] = json.loads(json.dumps(raw["spec"]))
    changed["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["regexp"] = "("
    cached.modules.put(changed)
    await rec.reconcile("ns/m")
    assert len(server.seen) == 4


async def test_a_fenced_writer_sends_nothing_not_even_an_event(
    writer: tuple[writing.Writer, Server],
) -> None:
    write, server = writer
    write.fence = lambda: False  # the lease may have run out
    with pytest.raises(errors.Fenced):
        await write.patch_node_labels(node("10"), {"ready": ""})
    with pytest.raises(errors.Fenced):
        await write.apply_daemonset({"metadata": {"name": "ds", "namespace": "ns"}}, None)
    with pytest.raises(errors.Fenced):  # best effort, but not past the fence
        await write.create_event({"metadata": {"namespace": "ns"}})
    assert server.seen == []
    assert write.api.counter.total_writes == 0
    assert len(write.pending) == 0  # nothing remembered as in flight


async def test_a_daemonset_deleted_again_after_being_made_again_is_deleted_again(
    writer: tuple[writing.Writer, Server],
) -> None:
    """The churn's orphan device-plugin DaemonSet: the cache may show a delete
    (its DELETED event) before the DELETE call returns, so no later event
    clears what the call leaves in flight. The same name made again (the
    device plugin switched on again) is another object, and switching it off
    must delete it."""
    write, server = writer
    ok = {"kind": "Status", "status": "Success"}
    server.script((200, ok), (200, ok))
    first = {"metadata": {"name": "ds", "namespace": "ns", "uid": "u1", "resourceVersion": "5"}}
    assert await write.delete_daemonset(first)
    # While the cache still shows the object deleted, no second DELETE.
    assert not await write.delete_daemonset(first)
    again = {"metadata": {"name": "ds", "namespace": "ns", "uid": "u2", "resourceVersion": "9"}}
    write.pending.seen("ns/ds", "9")  # its ADDED event
    assert await write.delete_daemonset(again)
    assert [s.method for s in server.seen] == ["DELETE", "DELETE"]


def _not_found(what: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f"{what} not found",
        "reason": "NotFound",
        "code": 404,
    }


async def test_writes_answered_404_or_409_leave_nothing_in_flight(
    writer: tuple[writing.Writer, Server],
) -> None:
    """A write that changed nothing has no result for an event to show, so
    nothing may wait for one: the object is gone, or (a DeviceClass delete
    guarded by uid) another object holds the name."""
    write, server = writer
    conflict = {
        "kind": "Status",
        "status": "Failure",
        "reason": "Conflict",
        "code": 409,
        "message": "Precondition failed: UID in precondition: u1, UID in object meta: u2",
    }
    server.script(
        (404, _not_found('daemonsets.apps "ds"')),
        (409, conflict),
        (404, _not_found('deviceclasses.resource.k8s.io "dc"')),
        (409, conflict),
        (404, _not_found('nodes "n1"')),
        (404, _not_found('modules.kmm.sigs.x-k8s.io "m"')),
        (404, _not_found('modules.kmm.sigs.x-k8s.io "m"')),
    )
    ds = {"metadata": {"name": "ds", "namespace": "ns", "uid": "u1", "resourceVersion": "5"}}
    dc = {"metadata": {"name": "dc", "uid": "u1", "resourceVersion": "5"}}
    module = {"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "3"}}
    assert not await write.delete_daemonset(ds)
    # A stale cache: another DaemonSet took the name (the uid guard: 409).
    taken = {"metadata": {"name": "ds2", "namespace": "ns", "uid": "u1", "resourceVersion": "6"}}
    assert not await write.delete_daemonset(taken)
    assert not await write.delete_device_class("dc", dc)
    replaced = {"metadata": {"name": "dc2", "uid": "u1", "resourceVersion": "6"}}
    assert not await write.delete_device_class("dc2", replaced)
    await write.patch_node_labels(node("10"), {"ready": ""})
    await write.patch_module_status(module, {"status": {"observedGeneration": 1}})
    await write.set_finalizers(module, [])
    assert len(server.seen) == 7
    assert len(write.pending) == 0


async def test_every_delete_is_guarded_by_the_observed_uid_and_none_goes_unobserved(
    writer: tuple[writing.Writer, Server],
) -> None:
    """A DELETE goes only to the object the cache showed (its uid a
    precondition: the API server answers 409 for another that took the
    name), and a delete of something never observed (no uid) is a bug that
    sends nothing."""
    write, server = writer
    ok = {"kind": "Status", "status": "Success"}
    server.script((200, ok), (200, ok), (200, ok))
    ds = {"metadata": {"name": "ds", "namespace": "ns", "uid": "u-ds"}}
    dc = {"metadata": {"name": "dc", "uid": "u-dc"}}
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-pod"}}
    assert await write.delete_daemonset(ds)
    assert await write.delete_device_class("dc", dc)
    assert await write.delete_pod(pod)
    assert [json.loads(s.body)["preconditions"] for s in server.seen] == [
        {"uid": "u-ds"},
        {"uid": "u-dc"},
        {"uid": "u-pod"},
    ]
    for unobserved in (
        write.delete_daemonset({"metadata": {"name": "fluentd", "namespace": "ns"}}),
        write.delete_device_class("dc", {}),
        write.delete_pod({"metadata": {"name": "p", "namespace": "ns"}}),
    ):
        with pytest.raises(ValueError, match="unobserved"):
            await unobserved
    assert len(server.seen) == 3
    assert len(write.pending) == 3  # the three sent, until their events come


class _EventBeforeReply(client.Client):
    """A client whose writes come back only after the informer has handed
    ``pending`` the object's event: the cache shows each write before its
    reply does (the race a loaded API server makes)."""

    pending: inflight.Pending
    events: list[tuple[str, str | None]]

    async def send(self, method: str, path: str, **options: Unpack[client.Options]) -> client.Reply:
        reply = await super().send(method, path, **options)
        key, version = self.events.pop(0)
        self.pending.seen(key, version)
        return reply


async def test_events_that_beat_the_reply_leave_nothing_in_flight() -> None:
    async with Server() as server:
        api = _EventBeforeReply(kubeclients.for_server(server.url).access, max_attempts=1)
        async with api:
            write = writing.Writer(api)
            api.pending = write.pending
            ok = {"kind": "Status", "status": "Success"}
            server.script(
                (200, ok),
                (200, ok),
                (201, {"metadata": {"resourceVersion": "7"}}),
                (200, {"metadata": {"resourceVersion": "12"}}),
            )
            api.events = [("ns/ds", None), (inflight.class_key("dc"), None)]
            api.events += [("ns/ds", "7"), ("n1", "12")]
            ds = {"metadata": {"name": "ds", "namespace": "ns", "uid": "u1"}}
            assert await write.delete_daemonset(ds)
            dc = {"metadata": {"name": "dc", "uid": "u2"}}
            assert await write.delete_device_class("dc", dc)
            desired = {"metadata": {"name": "ds", "namespace": "ns"}, "spec": {}}
            assert await write.apply_daemonset(desired, None)
            assert await write.patch_node_labels(node("10"), {"ready": ""})
            assert len(server.seen) == 4
            assert len(write.pending) == 0


async def test_a_create_the_cache_never_showed_does_not_block_the_same_create_after_a_relist(
    writer: tuple[writing.Writer, Server],
) -> None:
    """The pod informer's watch broke; meanwhile the pod kmm created was
    deleted (say by hand), so its ADDED and DELETED events were never seen,
    and the relist that closes the gap does not list it: no event would ever
    clear its entry, and the identical create (the planner wants the pod
    again) would be skipped for ever."""
    write, server = writer
    pods_informer = informers.Informer(
        "pods", listwatch.ApiListWatch(write.api, resources.PODS), projection=caches.project_pod
    )
    write.pending.follow(pods_informer, inflight.POD_PREFIX)
    pods_informer.replace([], "5")  # the first list
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m-build-k", "namespace": "ns"}}
    server.script(
        (201, {"metadata": {"name": "m-build-k", "namespace": "ns", "resourceVersion": "12"}}),
        (201, {"metadata": {"name": "m-build-k", "namespace": "ns", "resourceVersion": "40"}}),
    )
    assert await write.create_pod(pod)
    # The cache has not shown it yet: a reconcile in that gap sends nothing.
    assert not await write.create_pod(pod)
    # Made at 12, deleted at 20, listed again at 30: never shown.
    pods_informer.replace([], "30")
    assert await write.create_pod(pod)
    assert len(server.seen) == 2
    # A list older than a create's result leaves its entry: the cache may
    # still show it.
    pods_informer.replace([], "35")
    assert not await write.create_pod(pod)
    # Other key spaces are not this informer's to clear.
    write.pending.sent("ns/ds", "apply", {"spec": {}}, "33")
    pods_informer.replace([], "50")
    assert write.pending.in_flight("ns/ds", "apply", None, {"spec": {}}) is False
    assert write.pending.in_flight("ns/ds", "apply", "31", {"spec": {}}) is True
    assert len(write.pending) == 1


async def test_a_pod_that_ended_goes_at_once_and_one_still_running_gets_a_grace_period(
    writer: tuple[writing.Writer, Server],
) -> None:
    """A replaced build pod may still be running: deleted without grace, its
    object would go at once while its container still ran (and pushed), and
    its successor of the same name could start beside it. With a grace
    period the object goes only once the kubelet stopped the containers."""
    write, server = writer
    ok = {"kind": "Status", "status": "Success"}
    server.script((200, ok), (200, ok), (200, ok))

    def pod(name: str, phase: str | None) -> dict[str, Any]:
        found: dict[str, Any] = {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}}
        if phase is not None:
            found["status"] = {"phase": phase}
        return found

    assert await write.delete_pod(pod("done", "Succeeded"))
    assert await write.delete_pod(pod("running", "Running"))
    assert await write.delete_pod(pod("new", None))
    bodies = [json.loads(sent.body) for sent in server.seen]
    assert [b["gracePeriodSeconds"] for b in bodies] == [0, 1, 1]
    assert [b["preconditions"] for b in bodies] == [{"uid": "u-done"}, {"uid": "u-running"}, {"uid": "u-new"}]  # fmt: skip
