"""The ResourceSlice publisher against a wire-level fake API server; writes are counted."""

from __future__ import annotations

import asyncio

import pytest

from kmm.aio import backoff
from kmm.kube import client
from kmm.kubeletplugin import claims, errors, publishing

from . import fakeapi

NODE = claims.NodeName("node-a")
DRIVER = claims.DriverName("test.example.com")


def devices(count: int, *, tag: str = "a") -> list[publishing.Device]:
    return [
        {"name": f"dev{i}", "attributes": {"tag": {"string": tag}, "index": {"int": i}}}
        for i in range(count)
    ]


def publisher(
    api: client.Client, reported: list[BaseException] | None = None
) -> publishing.Publisher:
    sink = reported if reported is not None else []
    return publishing.Publisher(
        api,
        driver=DRIVER,
        node=NODE,
        on_error=lambda err, _msg: sink.append(err),
        delays=backoff.Backoff(initial=0.0, jitter=0.0),
    )


def generations(fake: fakeapi.FakeAPI) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in fake.slices.values()}


async def test_300_devices_make_three_slices_of_one_generation(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    pub = publisher(api)
    pub.publish(devices(300))
    result = await pub.sync()
    assert result == {"created": 3, "deleted": 0, "generation": 1}
    assert sorted(len(s["spec"]["devices"]) for s in fake_api.slices.values()) == [44, 128, 128]
    assert generations(fake_api) == {1}
    for s in fake_api.slices.values():
        assert s["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": NODE,
                "uid": "uid-of-node-a",
                "controller": True,
            }
        ]
        assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert s["spec"]["nodeName"] == NODE
        assert s["spec"]["driver"] == DRIVER


async def test_same_devices_again_write_nothing(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    pub = publisher(api)
    pub.publish(devices(300))
    await pub.sync()
    writes = fake_api.writes
    pub.publish(devices(300))
    result = await pub.sync()
    assert result["created"] == result["deleted"] == 0
    assert fake_api.writes == writes
    # a fresh publisher (a restart) compares with the server, not with memory
    again = publisher(api)
    again.publish(devices(300))
    await again.sync()
    assert fake_api.writes == writes


async def test_one_changed_device_bumps_generation_and_removes_old_slices(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    pub = publisher(api)
    pub.publish(devices(300))
    await pub.sync()
    old = set(fake_api.slices)
    changed = devices(300)
    changed[7] = {"name": "dev7", "attributes": {"tag": {"string": "b"}}}
    pub.publish(changed)
    result = await pub.sync()
    assert result == {"created": 3, "deleted": 3, "generation": 2}
    assert generations(fake_api) == {2}
    assert not old & set(fake_api.slices)


async def test_leftover_old_generation_is_deleted_without_rewriting(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    pub = publisher(api)
    pub.publish(devices(3))
    await pub.sync()
    stale = dict(next(iter(fake_api.slices.values())))
    stale = {
        **stale,
        "metadata": {"name": "stale"},
        "spec": {**stale["spec"], "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1}},
    }
    fake_api.slices["stale"] = stale
    posts = fake_api.requests["POST"]
    result = await pub.sync()
    assert result == {"created": 0, "deleted": 1, "generation": 1}
    assert fake_api.requests["POST"] == posts


async def test_no_devices_publish_one_empty_slice(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    pub = publisher(api)
    await pub.sync()
    assert [s["spec"]["devices"] for s in fake_api.slices.values()] == [[]]


async def test_recoverable_failures_are_reported_and_retried(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    reported: list[BaseException] = []
    pub = publisher(api, reported)
    pub.publish(devices(2))
    fake_api.fail_next = [503, 500]
    task = asyncio.create_task(pub.run())
    try:
        await asyncio.wait_for(pub.in_sync.wait(), timeout=10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [type(err) for err in reported] == [errors.PublishError, errors.PublishError]
    assert len(fake_api.slices) == 1


async def test_fatal_failure_is_reported_and_ends_the_loop(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    reported: list[BaseException] = []
    pub = publisher(api, reported)
    fake_api.fail_next = [403]
    await asyncio.wait_for(pub.run(), timeout=10)
    assert [type(err) for err in reported] == [errors.FatalError]


async def test_other_nodes_slices_are_left_alone(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    other = publishing.Publisher(
        api, driver=DRIVER, node=claims.NodeName("node-b"), on_error=lambda e, m: None
    )
    other.publish(devices(1))
    await other.sync()
    pub = publisher(api)
    pub.publish(devices(1, tag="x"))
    await pub.sync()
    pub.publish(devices(1, tag="y"))
    await pub.sync()
    nodes = sorted(s["spec"]["nodeName"] for s in fake_api.slices.values())
    assert nodes == ["node-a", "node-b"]
    # node-b does not exist: its slice simply has no owner
    (orphan,) = [s for s in fake_api.slices.values() if s["spec"]["nodeName"] == "node-b"]
    assert "ownerReferences" not in orphan["metadata"]
