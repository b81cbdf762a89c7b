"""A claim whose prepare failed and whose undo failed too: its release is
pending, never answered as prepared, retried at its unprepare and before its
next prepare, and kept across a restart (``plugins``)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest

from kmm.kubeletplugin import checkpointing, claimcache, claims, plugins

from . import fakes
from .kubelet import Kubelet
from .test_plugin import Harness, make_plugin


@pytest.fixture
async def harness(root: pathlib.Path) -> AsyncIterator[Harness]:
    owner, policy, source = fakes.FakeOwner(), fakes.FakePolicy(), claimcache.StaticClaims()
    plugin = make_plugin(root, policy=policy, owner=owner, source=source)
    await plugin.start()
    plugin.allow_claims()
    async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
        try:
            yield Harness(plugin, owner, policy, source, plugin.paths, kubelet)
        finally:
            await plugin.stop()


def _on_disk(paths: plugins.Paths) -> dict[claims.ClaimUID, checkpointing.ClaimRecord]:
    checkpoint = checkpointing.Checkpoint(paths.plugin_data_dir)
    checkpoint.load()
    checkpoint.close()
    return checkpoint.claims


def _fail_with_the_undo(
    owner: fakes.FakeOwner, policy: fakes.FakePolicy, claim: claims.ResourceClaim
) -> claims.ClaimUID:
    """The policy prepares the claim, the owner's commit fails it, and the
    policy cannot take it back: it still holds the devices."""
    uid = claims.ClaimUID(claim["metadata"]["uid"])
    owner.fail_allocated.add(uid)
    policy.fail_unprepare.add(uid)
    return uid


async def test_a_failed_undo_leaves_the_claim_pending_until_its_unprepare_releases_it(
    harness: Harness,
) -> None:
    claim = harness.add("c")
    uid = _fail_with_the_undo(harness.owner, harness.policy, claim)
    assert "commit" in (await harness.kubelet.prepare(claim))[uid].error
    assert uid in harness.policy.prepared  # still held by the policy
    assert harness.plugin.prepared()[uid].state == checkpointing.RELEASE_PENDING
    assert _on_disk(harness.paths)[uid].state == checkpointing.RELEASE_PENDING

    # The kubelet's unprepare, while the policy still cannot release: an
    # error, and the claim stays pending.
    assert "cannot release" in (await harness.kubelet.unprepare(claim))[uid]
    assert harness.plugin.prepared()[uid].state == checkpointing.RELEASE_PENDING

    harness.policy.fail_unprepare.clear()
    assert await harness.kubelet.unprepare(claim) == {uid: ""}
    assert uid not in harness.policy.prepared
    assert [r.uid for r in harness.owner.released] == [uid]
    assert harness.plugin.prepared() == {}
    assert _on_disk(harness.paths) == {}


async def test_a_prepare_of_a_pending_claim_releases_it_first_then_prepares_afresh(
    harness: Harness,
) -> None:
    claim = harness.add("c", devices=("dev4",))
    uid = _fail_with_the_undo(harness.owner, harness.policy, claim)
    assert (await harness.kubelet.prepare(claim))[uid].error
    assert (harness.policy.prepare_calls, harness.policy.unprepare_calls) == (1, 1)

    # The kubelet retries the prepare; the release fails again: not prepared.
    error = (await harness.kubelet.prepare(claim))[uid].error
    assert "could not be released: policy cannot release" in error
    assert (harness.policy.prepare_calls, harness.policy.unprepare_calls) == (1, 2)
    assert harness.plugin.prepared()[uid].state == checkpointing.RELEASE_PENDING
    assert not list(harness.paths.cdi_dir.glob("*"))  # no spec written

    harness.policy.fail_unprepare.clear()
    harness.owner.fail_allocated.clear()
    answer = (await harness.kubelet.prepare(claim))[uid]
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["dev4"]
    assert (harness.policy.prepare_calls, harness.policy.unprepare_calls) == (2, 3)
    assert [r.uid for r in harness.owner.released] == [uid]  # released before
    assert [r.uid for r in harness.owner.allocated] == [uid]  # allocated afresh
    assert harness.plugin.prepared()[uid].state == checkpointing.COMPLETED
    assert _on_disk(harness.paths) == harness.plugin.prepared()


async def test_a_pending_release_is_kept_across_a_restart(root: pathlib.Path) -> None:
    # The policy and the owner outlive the plugin, as the node driver's do.
    owner, policy, source = fakes.FakeOwner(), fakes.FakePolicy(), claimcache.StaticClaims()
    claim = fakes.make_claim("c")
    source.put(claim)
    uid = _fail_with_the_undo(owner, policy, claim)
    first = make_plugin(root, policy=policy, owner=owner, source=source)
    await first.start()
    first.allow_claims()
    async with Kubelet(first.paths.registration_socket(fakes.DRIVER)) as kubelet:
        assert (await kubelet.prepare(claim))[uid].error
    await first.stop()

    policy.fail_unprepare.clear()
    second = make_plugin(root, policy=policy, owner=owner, source=source)
    await second.start()
    second.allow_claims()
    try:
        assert second.prepared()[uid].state == checkpointing.RELEASE_PENDING
        assert uid not in policy.restored  # not prepared: nothing to relearn
        assert uid in policy.prepared
        async with Kubelet(second.paths.registration_socket(fakes.DRIVER)) as kubelet:
            assert await kubelet.unprepare(claim) == {uid: ""}
        assert uid not in policy.prepared
        assert second.prepared() == {}
        assert _on_disk(second.paths) == {}
    finally:
        await second.stop()
