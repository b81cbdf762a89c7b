"""The ResourceSlice publisher against a real API server (the sandbox).

300 devices make 3 slices of one generation; the same set again writes
nothing; one changed device bumps the generation and removes the old slices.
Writes are counted on the client (``kube.client.Client.counter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubeletplugin import claims, publishing
from kmm.sandbox import cluster, testing

pytestmark = pytest.mark.integration


def devices(count: int, *, changed: int | None = None) -> list[publishing.Device]:
    return [
        {
            "name": f"dev{i}",
            "attributes": {
                "index": {"int": i},
                "model": {"string": "changed" if i == changed else "base"},
            },
            "capacity": {"memory": {"value": "1Gi"}},
        }
        for i in range(count)
    ]


def writes(api: kube_client.Client) -> int:
    return api.counter.total_writes


@pytest.fixture
async def publisher(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> AsyncIterator[tuple[publishing.Publisher, kube_client.Client]]:
    api = kmm_api
    errors: list[BaseException] = []
    pub = publishing.Publisher(
        api,
        driver=claims.DriverName(f"it-{uuid.uuid4().hex[:8]}.example.com"),
        node=claims.NodeName(sandbox.node_names[0]),
        on_error=lambda err, _msg: errors.append(err),
    )
    try:
        yield pub, api
    finally:
        await pub.delete_all()
    assert errors == []


async def test_publishing_300_devices(
    publisher: tuple[publishing.Publisher, kube_client.Client],
) -> None:
    pub, api = publisher
    pub.publish(devices(300))
    first = await pub.sync()
    assert first["created"] == 3
    slices = await pub.list_slices()
    assert len(slices) == 3
    assert {s["spec"]["pool"]["generation"] for s in slices} == {first["generation"]}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert sorted(len(s["spec"]["devices"]) for s in slices) == [44, 128, 128]
    # owned by the Node, so they go when the node goes
    assert {s["metadata"]["ownerReferences"][0]["kind"] for s in slices} == {"Node"}

    before = writes(api)
    pub.publish(devices(300))
    again = await pub.sync()
    assert again == {"created": 0, "deleted": 0, "generation": first["generation"]}
    assert writes(api) == before

    old = {s["metadata"]["name"] for s in slices}
    pub.publish(devices(300, changed=7))
    bumped = await pub.sync()
    assert bumped["generation"] == first["generation"] + 1
    assert bumped["deleted"] == 3
    now = await pub.list_slices()
    assert len(now) == 3
    assert {s["spec"]["pool"]["generation"] for s in now} == {bumped["generation"]}
    assert not old & {s["metadata"]["name"] for s in now}


async def test_a_slice_deleted_by_someone_else_is_published_again(
    sandbox: testing.RunningSandbox, publisher: tuple[publishing.Publisher, kube_client.Client]
) -> None:
    """As after the kubelet's wipe of a node's slices: the running publisher
    sees the deletion on its watch and publishes again."""
    pub, api = publisher
    pub.publish(devices(2))
    running = asyncio.ensure_future(pub.run())
    try:
        await asyncio.wait_for(pub.in_sync.wait(), timeout=60)
        (first,) = await pub.list_slices()
        await api.request("DELETE", resources.RESOURCE_SLICES.path(name=first["metadata"]["name"]))

        async def back() -> bool:
            found = await pub.list_slices()
            return len(found) == 1 and found[0]["metadata"]["name"] != first["metadata"]["name"]

        await testing.eventually(back, "the slice published again")
        # Its own writes seen on the watch make no further writes. Someone
        # else's edit that changes no device comes after them on the watch:
        # once the publisher synced past it, it had seen its own writes too.
        settled = writes(api)
        changes = pub.changes
        (again,) = await pub.list_slices()
        async with cluster.api_client(sandbox.kubeconfig) as someone:
            await someone.request(
                "PATCH",
                resources.RESOURCE_SLICES.path(name=again["metadata"]["name"]),
                body={"metadata": {"labels": {"example.com/edited": "yes"}}},
                content_type=kube_client.MERGE_PATCH,
            )

        async def synced_past_the_edit() -> bool:
            return pub.synced_changes > changes

        await testing.eventually(synced_past_the_edit, "a sync after the edit")
        assert writes(api) == settled
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
