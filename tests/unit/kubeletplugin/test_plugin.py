"""The plugin over real unix sockets, with a test client playing the kubelet."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from kmm.aio import ratelimits
from kmm.kube import client
from kmm.kubeletplugin import checkpointing, claimcache, claims, errors, plugins, serving

from . import fakeapi, fakes
from .kubelet import Kubelet, devices_of


@dataclass
class Harness:
    plugin: plugins.Plugin
    owner: fakes.FakeOwner
    policy: fakes.FakePolicy
    claims: claimcache.StaticClaims
    paths: plugins.Paths
    kubelet: Kubelet

    def add(self, name: str, **kwargs: object) -> claims.ResourceClaim:
        claim = fakes.make_claim(name, **kwargs)  # type: ignore[arg-type]
        self.claims.put(claim)
        return claim


def make_plugin(
    root: pathlib.Path,
    *,
    policy: fakes.FakePolicy | None = None,
    owner: fakes.FakeOwner | None = None,
    source: claimcache.ClaimSource | None = None,
    api: client.Client | None = None,
) -> plugins.Plugin:
    return plugins.Plugin(
        fakes.DRIVER,
        node=fakes.NODE,
        owner=owner or fakes.FakeOwner(),
        policy=policy or fakes.FakePolicy(),
        claim_source=source or claimcache.StaticClaims(),
        paths=plugins.Paths.under(root, fakes.DRIVER),
        api=api,
        stop_grace=30,
    )


@pytest.fixture
async def harness(root: pathlib.Path) -> AsyncIterator[Harness]:
    owner, policy, source = fakes.FakeOwner(), fakes.FakePolicy(), claimcache.StaticClaims()
    plugin = make_plugin(root, policy=policy, owner=owner, source=source)
    await plugin.start()
    plugin.allow_claims()
    paths = plugin.paths
    async with Kubelet(paths.registration_socket(fakes.DRIVER)) as kubelet:
        try:
            yield Harness(plugin, owner, policy, source, paths, kubelet)
        finally:
            await plugin.stop()


async def test_get_info(harness: Harness) -> None:
    info = await harness.kubelet.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == fakes.DRIVER
    assert info.endpoint == str(harness.paths.dra_socket)
    assert os.path.isabs(info.endpoint)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    await harness.kubelet.notify(True)
    assert harness.plugin.registered.is_set()
    # directories the plugin creates are owner-only
    assert stat.S_IMODE(harness.paths.plugin_data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(harness.paths.registrar_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_and_unprepare(harness: Harness, version: str) -> None:
    claim = harness.add("gpu", devices=("dev0", "dev1"))
    uid = claim["metadata"]["uid"]
    answers = await harness.kubelet.prepare(claim, version=version)
    assert answers[uid].error == ""
    assert devices_of(answers[uid]) == [
        (fakes.NODE, "dev0", ["req0"], [f"{fakes.DRIVER}/claim={uid}-0"]),
        (fakes.NODE, "dev1", ["req1"], [f"{fakes.DRIVER}/claim={uid}-1"]),
    ]
    spec_path = harness.paths.cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == f"{fakes.DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-0", f"{uid}-1"]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/dev1"}]
    assert [r.uid for r in harness.owner.allocated] == [uid]

    assert await harness.kubelet.unprepare(claim, version=version) == {uid: ""}
    assert not spec_path.exists()
    assert [r.uid for r in harness.owner.released] == [uid]
    assert harness.plugin.prepared() == {}


async def test_prepare_is_idempotent_and_rebuilds_a_lost_cdi_spec(harness: Harness) -> None:
    claim = harness.add("c")
    uid = claim["metadata"]["uid"]
    first = devices_of((await harness.kubelet.prepare(claim))[uid])
    second = devices_of((await harness.kubelet.prepare(claim))[uid])
    assert first == second
    spec_path = harness.paths.cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"
    content = spec_path.read_bytes()
    spec_path.unlink()
    third = devices_of((await harness.kubelet.prepare(claim))[uid])
    assert third == first
    assert spec_path.read_bytes() == content
    assert harness.policy.prepare_calls == 1
    assert len(harness.owner.allocated) == 1


async def test_a_torn_cdi_spec_is_rewritten_at_the_next_prepare(harness: Harness) -> None:
    # Specs are not fsynced: after a power loss one may be empty or cut short.
    claim = harness.add("c")
    uid = claim["metadata"]["uid"]
    await harness.kubelet.prepare(claim)
    spec_path = harness.paths.cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"
    content = spec_path.read_bytes()
    spec_path.write_bytes(content[: len(content) // 2])
    assert (await harness.kubelet.prepare(claim))[uid].error == ""
    assert spec_path.read_bytes() == content
    assert harness.policy.prepare_calls == 1


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced from now on, in order."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _journal_lines(paths: plugins.Paths) -> int:
    return len((paths.plugin_data_dir / checkpointing.JOURNAL_NAME).read_bytes().splitlines())


@pytest.mark.parametrize("batch", [1, 32])
async def test_a_call_appends_one_journal_line_per_phase_and_fsyncs_nothing(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """The plugins docstring says why no fsync is needed per call."""
    synced = _record_fsyncs(monkeypatch)
    before = _journal_lines(harness.paths)
    batch_claims = [harness.add(f"c{i}") for i in range(batch)]
    answers = await harness.kubelet.prepare(*batch_claims)
    assert all(answer.error == "" for answer in answers.values())
    assert synced == []
    assert _journal_lines(harness.paths) == before + 2  # "started", "completed"
    assert len(list(harness.paths.cdi_dir.iterdir())) == batch
    assert set((await harness.kubelet.unprepare(*batch_claims)).values()) == {""}
    assert synced == []
    assert _journal_lines(harness.paths) == before + 3
    assert list(harness.paths.cdi_dir.iterdir()) == []
    # Unknown claims: nothing to record.
    assert set((await harness.kubelet.unprepare(*batch_claims)).values()) == {""}
    assert _journal_lines(harness.paths) == before + 3


async def test_a_journal_past_its_limit_is_folded_into_a_new_snapshot(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = harness.add("c")
    uid = claim["metadata"]["uid"]
    harness.plugin.checkpoint.journal_limit = 1
    synced = _record_fsyncs(monkeypatch)
    assert (await harness.kubelet.prepare(claim))[uid].error == ""
    data_dir = str(harness.paths.plugin_data_dir)
    snapshot = f"{data_dir}/.{checkpointing.FILE_NAME}.tmp"
    journal = f"{data_dir}/.{checkpointing.JOURNAL_NAME}.tmp"
    # Folded after "started" and again after "completed": snapshot, then journal.
    assert synced == [snapshot, data_dir, journal, data_dir] * 2
    assert _journal_lines(harness.paths) == 1  # the header alone
    envelope = json.loads((harness.paths.plugin_data_dir / checkpointing.FILE_NAME).read_text())
    assert json.loads(envelope["data"])["claims"][uid]["state"] == checkpointing.COMPLETED
    saved = checkpointing.Checkpoint(harness.paths.plugin_data_dir)
    saved.load()
    assert saved.claims == harness.plugin.prepared()


async def test_specs_without_a_prepared_claim_are_removed_at_start(root: pathlib.Path) -> None:
    # An unprepare cut short after its checkpoint commit leaves its spec behind.
    cdi_dir = plugins.Paths.under(root, fakes.DRIVER).cdi_dir
    cdi_dir.mkdir(parents=True)
    orphan = cdi_dir / f"{fakes.DRIVER}-claim_0000-gone.json"
    orphan.write_text("{}")
    foreign = cdi_dir / "other.example.com-claim_0000-gone.json"
    foreign.write_text("{}")
    source = claimcache.StaticClaims()
    first = make_plugin(root, source=source)
    await first.start()
    first.allow_claims()
    claim = fakes.make_claim("kept")
    source.put(claim)
    uid = claim["metadata"]["uid"]
    try:
        async with Kubelet(first.paths.registration_socket(fakes.DRIVER)) as kubelet:
            assert (await kubelet.prepare(claim))[uid].error == ""
    finally:
        await first.stop()
    kept = cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"
    assert not orphan.exists()
    assert foreign.exists()  # another driver's
    orphan.write_text("{}")
    again = make_plugin(root, source=source)
    await again.start()
    await again.stop()
    assert sorted(p.name for p in cdi_dir.iterdir()) == sorted([kept.name, foreign.name])


async def test_a_spec_that_cannot_be_written_fails_its_claim_alone(harness: Harness) -> None:
    good, bad = harness.add("good"), harness.add("bad")
    bad_uid = bad["metadata"]["uid"]
    spec = harness.paths.cdi_dir / f"{fakes.DRIVER}-claim_{bad_uid}.json"
    blocker = spec.with_name(f".{spec.name}.tmp")
    blocker.mkdir(parents=True)  # the temporary file cannot be created
    answers = await harness.kubelet.prepare(good, bad)
    assert answers[good["metadata"]["uid"]].error == ""
    assert f"cannot write CDI spec {spec}" in answers[bad_uid].error
    assert set(harness.plugin.prepared()) == {good["metadata"]["uid"]}
    assert [r.uid for r in harness.owner.released] == [bad_uid]  # its commit taken back
    assert bad_uid not in harness.policy.prepared
    saved = checkpointing.Checkpoint(harness.paths.plugin_data_dir)
    saved.load()
    assert saved.claims[good["metadata"]["uid"]].state == checkpointing.COMPLETED
    # On disk still "started": a restart before the retry cleans it up.
    assert saved.claims[bad_uid].state == checkpointing.STARTED
    blocker.rmdir()  # space is back: the retry succeeds
    assert (await harness.kubelet.prepare(bad))[bad_uid].error == ""
    assert spec.exists()
    saved.load()
    assert saved.claims[bad_uid].state == checkpointing.COMPLETED


async def test_after_a_reboot_claims_prepared_before_it_are_prepared_again(
    root: pathlib.Path,
) -> None:
    """A power loss may undo an unprepare's commit: a claim from before the
    reboot must not keep its devices from the policy (nor be trusted as done)."""
    source, policy = claimcache.StaticClaims(), fakes.FakePolicy()
    kept, released = fakes.make_claim("kept"), fakes.make_claim("released")
    for claim in (kept, released):
        source.put(claim)
    first = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=policy,
        claim_source=source, paths=plugins.Paths.under(root, fakes.DRIVER), boot_id="boot-1",
    )  # fmt: skip
    await first.start()
    first.allow_claims()
    try:
        async with Kubelet(first.paths.registration_socket(fakes.DRIVER)) as kubelet:
            answers = await kubelet.prepare(kept, released)
    finally:
        await first.stop()
    assert {a.error for a in answers.values()} == {""}

    def restarted(boot: str) -> tuple[plugins.Plugin, fakes.FakePolicy]:
        fresh = fakes.FakePolicy()
        return plugins.Plugin(
            fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fresh,
            claim_source=source, paths=plugins.Paths.under(root, fakes.DRIVER), boot_id=boot,
        ), fresh  # fmt: skip

    same_boot, policy = restarted("boot-1")  # a restart of the process only
    await same_boot.start()
    await same_boot.stop()
    assert sorted(policy.restored) == sorted(c["metadata"]["uid"] for c in (kept, released))

    rebooted, policy = restarted("boot-2")
    await rebooted.start()
    rebooted.allow_claims()
    try:
        assert policy.restored == {}  # nothing is held for claims from before
        uid = kept["metadata"]["uid"]
        assert rebooted.prepared()[uid].state == checkpointing.STARTED
        async with Kubelet(rebooted.paths.registration_socket(fakes.DRIVER)) as kubelet:
            again = (await kubelet.prepare(kept))[uid]
        assert again.error == ""
        assert devices_of(again) == devices_of(answers[uid])
        assert policy.prepare_calls == 1  # prepared again, the same devices
        assert rebooted.prepared()[uid].state == checkpointing.COMPLETED
    finally:
        await rebooted.stop()
    saved = checkpointing.Checkpoint(rebooted.paths.plugin_data_dir)
    saved.load()
    assert saved.boot_id == "boot-2"


class InstantClock:
    """Sleeps move time at once: the bucket's arithmetic, without the waiting."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: object) -> object:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        self.time += seconds
        await asyncio.sleep(0)


async def test_a_flood_of_unknown_claims_costs_a_bounded_number_of_gets(
    root: pathlib.Path, api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    bucket = ratelimits.TokenBucket(rate=10.0, burst=20, clock=InstantClock())  # type: ignore[arg-type]
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: None, lookups=bucket)
    known = fakes.make_claim("known")
    fake_api.put_claim(known)
    plugin = make_plugin(root, source=cache)
    await plugin.start()
    plugin.allow_claims()
    strangers = [
        claims.ClaimRef("default", f"n{i}", claims.ClaimUID(f"0000-{i:05d}")) for i in range(1000)
    ]
    try:
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            answers = await kubelet.prepare(known, *strangers)
    finally:
        await plugin.stop()
    assert len(answers) == 1001  # every claim answered
    assert answers[known["metadata"]["uid"]].error == ""
    # The cache's list, then the burst, then one GET a tenth of a second for
    # the one second the call's lookups may wait: not one GET per claim.
    assert fake_api.requests["GET"] == 1 + 20 + 10
    messages = [answers[r.uid].error for r in strangers]
    assert sum("not found" in m for m in messages) == 30
    assert sum("lookups are throttled (at most 10 a second)" in m for m in messages) == 970


async def test_unprepare_of_unknown_claim_succeeds(harness: Harness) -> None:
    ref = claims.ClaimRef("default", "never", claims.ClaimUID("0000-unknown"))
    assert await harness.kubelet.unprepare(ref) == {ref.uid: ""}
    assert harness.policy.unprepare_calls == 0


async def test_a_batch_answers_each_claim_on_its_own(harness: Harness) -> None:
    good = harness.add("good")
    failing = harness.add("failing")
    harness.policy.fail.add(failing["metadata"]["uid"])
    missing = claims.ClaimRef("default", "missing", claims.ClaimUID("1234-missing"))
    committed_badly = harness.add("commit")
    harness.owner.fail_allocated.add(committed_badly["metadata"]["uid"])
    answers = await harness.kubelet.prepare(good, failing, missing, committed_badly)
    uid = good["metadata"]["uid"]
    assert answers[uid].error == ""
    assert len(answers[uid].devices) == 1
    assert "policy refuses" in answers[failing["metadata"]["uid"]].error
    assert "not found" in answers[missing.uid].error
    assert "commit" in answers[committed_badly["metadata"]["uid"]].error
    assert set(harness.plugin.prepared()) == {uid}
    assert [p.name for p in harness.paths.cdi_dir.iterdir()] == [f"{fakes.DRIVER}-claim_{uid}.json"]


@pytest.mark.parametrize(
    "ref",
    [
        claims.ClaimRef("default", "c", claims.ClaimUID("../../../etc/passwd")),
        claims.ClaimRef("default", "c", claims.ClaimUID("abc/def")),
        claims.ClaimRef("default", "../c", claims.ClaimUID("abc-def")),
        claims.ClaimRef("..", "c", claims.ClaimUID("abc-def")),
        claims.ClaimRef("default", "c", claims.ClaimUID("")),
    ],
)
async def test_unsafe_claims_fail_alone_and_write_nothing_outside(
    harness: Harness, root: pathlib.Path, ref: claims.ClaimRef
) -> None:
    good = harness.add("good")
    # The claim source would even return a payload for it: validation comes first.
    harness.claims.put(
        {
            **fakes.make_claim(ref.name if "/" not in ref.name else "x"),
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        }
    )
    before = {p for p in root.rglob("*")}
    answers = await harness.kubelet.prepare(good, ref)
    assert answers[good["metadata"]["uid"]].error == ""
    assert "not a valid UID" in answers[ref.uid].error or "not a DNS" in answers[ref.uid].error
    unprepared = await harness.kubelet.unprepare(ref)
    assert unprepared[ref.uid] != ""
    allowed = (harness.paths.cdi_dir, harness.paths.plugin_data_dir)
    for new in {p for p in root.rglob("*")} - before:
        if new.is_dir() and harness.paths.cdi_dir.is_relative_to(new):
            continue  # /var/run, made on the way to the CDI directory
        assert any(new.is_relative_to(d) for d in allowed), new
    assert set(harness.plugin.prepared()) == {good["metadata"]["uid"]}


async def test_claims_are_refused_until_allowed(root: pathlib.Path) -> None:
    source = claimcache.StaticClaims()
    claim = fakes.make_claim("c")
    source.put(claim)
    plugin = make_plugin(root, source=source)
    await plugin.start()
    try:
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            uid = claim["metadata"]["uid"]
            answer = (await kubelet.prepare(claim))[uid]
            assert "not served yet" in answer.error
            assert "not served yet" in (await kubelet.unprepare(claim))[uid]
            plugin.allow_claims()
            assert (await kubelet.prepare(claim))[uid].error == ""
    finally:
        await plugin.stop()


async def test_concurrent_prepares_of_one_claim(harness: Harness) -> None:
    claim = harness.add("shared")
    uid = claim["metadata"]["uid"]
    harness.policy.gate = asyncio.Event()
    first = asyncio.create_task(harness.kubelet.prepare(claim))
    second = asyncio.create_task(harness.kubelet.prepare(claim))
    await asyncio.wait_for(harness.policy.entered.wait(), timeout=10)
    harness.policy.gate.set()
    a, b = await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
    assert devices_of(a[uid]) == devices_of(b[uid]) != []
    assert harness.policy.prepare_calls == 1


async def test_stop_with_a_request_in_flight_holding_the_lock(root: pathlib.Path) -> None:
    """Seed 001's ordering test: stop is not called under the lock and waits for the request."""
    owner, policy, source = fakes.FakeOwner(), fakes.FakePolicy(), claimcache.StaticClaims()
    claim = fakes.make_claim("c")
    source.put(claim)
    plugin = make_plugin(root, policy=policy, owner=owner, source=source)
    await plugin.start()
    plugin.allow_claims()
    policy.gate = asyncio.Event()
    reg = plugin.paths.registration_socket(fakes.DRIVER)
    async with Kubelet(reg) as kubelet:
        request = asyncio.create_task(kubelet.prepare(claim))
        await asyncio.wait_for(policy.entered.wait(), timeout=10)
        assert owner.lock.locked()  # the request in flight holds the owner's lock
        stopping = asyncio.create_task(plugin.stop())
        for _ in range(2000):  # bounded: fails instead of hanging
            if not reg.exists():
                break
            await asyncio.sleep(0.005)
        assert not reg.exists()
        assert not stopping.done()  # it waits for the request in flight
        policy.gate.set()
        await asyncio.wait_for(stopping, timeout=20)
        answer = await asyncio.wait_for(request, timeout=20)
    assert answer[claim["metadata"]["uid"]].error == ""
    assert not plugin.paths.dra_socket.exists()
    assert not owner.lock.locked()


async def test_start_and_stop_are_idempotent_and_sockets_are_private(
    root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = make_plugin(root)
    paths = plugin.paths
    reg = paths.registration_socket(fakes.DRIVER)
    for stale in (reg, paths.dra_socket):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("stale")
    order: list[str] = []
    original = serving.Server.start

    async def recording_start(self: serving.Server) -> None:
        order.append(self.socket.name)
        await original(self)

    monkeypatch.setattr(serving.Server, "start", recording_start)
    await plugin.start()
    await plugin.start()
    try:
        assert order == ["dra.sock", f"{fakes.DRIVER}-reg.sock"]
        for socket in (reg, paths.dra_socket):
            mode = socket.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
    finally:
        await plugin.stop()
        await plugin.stop()
    assert not reg.exists()
    assert not paths.dra_socket.exists()
    # and it can be started again
    await plugin.start()
    await plugin.stop()


async def test_handle_error_logs_recoverable_and_requests_shutdown_on_fatal(
    harness: Harness,
) -> None:
    harness.plugin.handle_error(errors.PublishError("503"), "publishing")
    assert harness.owner.shutdowns == []
    harness.plugin.handle_error(errors.FatalError("socket gone"), "serving")
    harness.plugin.handle_error(RuntimeError("bug"), "watching")
    assert harness.owner.shutdowns == ["serving: socket gone", "watching: bug"]
    assert harness.plugin.started  # the owner stops us, not handle_error


async def test_restart_answers_from_the_checkpoint(root: pathlib.Path) -> None:
    source = claimcache.StaticClaims()
    claim = fakes.make_claim("c", devices=("dev3",))
    uid = claim["metadata"]["uid"]
    source.put(claim)
    first = make_plugin(root, source=source)
    await first.start()
    first.allow_claims()
    async with Kubelet(first.paths.registration_socket(fakes.DRIVER)) as kubelet:
        before = devices_of((await kubelet.prepare(claim))[uid])
    await first.stop()
    # a reboot empties /var/run/cdi; the checkpoint survives
    for spec in first.paths.cdi_dir.iterdir():
        spec.unlink()
    policy = fakes.FakePolicy()
    second = make_plugin(root, source=source, policy=policy)
    await second.start()
    second.allow_claims()
    try:
        assert policy.restored == {uid: ["dev3"]}
        async with Kubelet(second.paths.registration_socket(fakes.DRIVER)) as kubelet:
            assert devices_of((await kubelet.prepare(claim))[uid]) == before
        assert policy.prepare_calls == 0
        assert len(list(second.paths.cdi_dir.iterdir())) == 1
    finally:
        await second.stop()


async def test_corrupted_checkpoint_stops_start_with_a_clear_error(root: pathlib.Path) -> None:
    plugin = make_plugin(root)
    plugin.paths.plugin_data_dir.mkdir(parents=True)
    path = plugin.paths.plugin_data_dir / checkpointing.FILE_NAME
    path.write_text('{"version": 1, "checksum": 1, "data": "{\\"claims\\": {}}"}')
    with pytest.raises(errors.CheckpointCorruptedError, match="checksum mismatch") as caught:
        await plugin.start()
    assert str(path) in str(caught.value)
    assert path.read_text().startswith('{"version": 1, "checksum": 1')  # kept as it was
    assert not plugin.started


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_health_stream(root: pathlib.Path, version: str) -> None:
    from kmm.kubeletplugin import owners

    policy = fakes.FakePolicy(health=True)
    plugin = make_plugin(root, policy=policy)
    await plugin.start()
    try:
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            info = await kubelet.get_info()
            # Both advertised, the newest first: a 1.37 kubelet calls v1, and
            # 1.35/1.36 kubelets (which know only v1alpha1) v1alpha1.
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            call = kubelet.health(info.endpoint, version)
            policy.health_queue.put_nowait(
                [owners.DeviceHealthReport(fakes.NODE, "dev0", owners.Health.UNHEALTHY, "gone")]
            )
            response = await asyncio.wait_for(call.read(), timeout=10)
            (device,) = response.devices
            assert (device.device.pool_name, device.device.device_name) == (fakes.NODE, "dev0")
            assert device.health == owners.Health.UNHEALTHY
            assert device.message == "gone"
            await asyncio.wait_for(plugin.stop(), timeout=20)  # the open stream does not hold stop
            call.cancel()
    finally:
        await plugin.stop()


async def test_devices_published_before_start_go_out_at_start(
    root: pathlib.Path, api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    plugin = make_plugin(root, api=api)
    plugin.publish([{"name": "early"}])
    assert fake_api.writes == 0
    await plugin.start()
    try:
        assert plugin.publisher is not None
        await asyncio.wait_for(plugin.publisher.in_sync.wait(), timeout=10)
        names = [d["name"] for s in fake_api.slices.values() for d in s["spec"]["devices"]]
        assert names == ["early"]
        plugin.publish([{"name": "early"}, {"name": "late"}])
        await asyncio.wait_for(plugin.publisher.in_sync.wait(), timeout=10)
        assert len(fake_api.slices) == 1
        assert [s["spec"]["pool"]["generation"] for s in fake_api.slices.values()] == [2]
    finally:
        await plugin.stop()


async def test_zero_api_calls_per_prepare_with_a_warm_cache(
    root: pathlib.Path, api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    warm = [fakes.make_claim(f"c{i}") for i in range(5)]
    for claim in warm:
        fake_api.put_claim(claim)
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: None)
    plugin = make_plugin(root, source=cache)
    await plugin.start()
    plugin.allow_claims()
    try:
        await asyncio.wait_for(cache.synced.wait(), timeout=10)
        before = api.counter.total
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            answers = await kubelet.prepare(*warm)
            assert all(answer.error == "" for answer in answers.values())
            assert api.counter.total == before
            cold = fakes.make_claim("cold")
            fake_api.put_claim(cold, notify=False)
            assert (await kubelet.prepare(cold))[cold["metadata"]["uid"]].error == ""
            assert api.counter.total == before + 1  # one GET, for the miss
    finally:
        await plugin.stop()


async def test_a_failed_start_leaves_no_socket_behind(
    root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = make_plugin(root)

    def broken(server: object, handler: object) -> None:
        raise RuntimeError("cannot add the registration service")

    monkeypatch.setattr(serving, "add_registration_service", broken)
    with pytest.raises(RuntimeError, match="registration service"):
        await plugin.start()
    assert not plugin.started
    assert not plugin.paths.dra_socket.exists()
    monkeypatch.undo()
    await plugin.start()  # and a later start works
    try:
        assert plugin.paths.registration_socket(fakes.DRIVER).exists()
    finally:
        await plugin.stop()


async def test_a_socket_path_too_long_for_unix_sockets_is_a_clear_error(
    tmp_path: pathlib.Path,
) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    server = serving.Server(deep / "dra.sock")
    with pytest.raises(errors.FatalError, match="unix socket paths allow 107"):
        await server.start()
