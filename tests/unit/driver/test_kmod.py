from __future__ import annotations

import asyncio
import pathlib
import shutil
from collections.abc import AsyncIterator, Sequence

import pytest

from kmm.driver import kmod
from kmm.kubeletplugin import checkpointing, claims, owners

from .conftest import make_tree


def policy(root: pathlib.Path, **kwargs: object) -> kmod.KmodPolicy:
    return kmod.KmodPolicy(root=root, module="foo", node="node-a", device_class="foo", **kwargs)  # type: ignore[arg-type]


def preparing(uid: str, *devices: str) -> owners.PreparingClaim:
    return owners.PreparingClaim(
        ref=claims.ClaimRef("ns", f"c-{uid}", claims.ClaimUID(uid)),
        results=tuple(
            {"request": "r", "driver": "d", "pool": "node-a", "device": d} for d in devices
        ),
        configs=(),
    )


def test_devices_and_attributes(root: pathlib.Path) -> None:
    make_tree(root)
    devices = policy(root).devices()
    assert [d["name"] for d in devices] == ["foo0", "foo1"]
    assert devices[0]["attributes"] == {
        "module": {"string": "foo"},
        "kernelVersion": {"string": "6.8.0-45-generic"},
        "moduleVersion": {"string": "1.2.3"},
        "major": {"int": 240},
        "minor": {"int": 0},
        "numaNode": {"int": 1},
    }
    assert "numaNode" not in devices[1]["attributes"]  # -1: no NUMA affinity


def test_dev_glob_without_a_class(root: pathlib.Path) -> None:
    make_tree(root)
    (root / "dev/foo_extra").write_text("")
    (root / "dev/other0").write_text("")
    found = kmod.KmodPolicy(root=root, module="foo", node="n").devices()
    assert [d["name"] for d in found] == ["foo0", "foo1", "foo-extra"]
    assert "moduleVersion" in found[0]["attributes"]


async def test_one_claim_per_device(root: pathlib.Path) -> None:
    make_tree(root)
    p = policy(root)
    (allocation,) = await p.prepare(preparing("u1", "foo0"))
    assert allocation.edits == {
        "env": ["KMM_DEVICE_FOO0=/dev/foo0"],
        "deviceNodes": [
            {
                "path": "/dev/foo0",
                "hostPath": str(root / "dev/foo0"),
                "type": "c",
                "permissions": "rw",
                "major": 240,
                "minor": 0,
            }
        ],
    }
    assert await p.prepare(preparing("u1", "foo0"))  # idempotent for the same claim
    with pytest.raises(ValueError, match="held by claim u1"):
        await p.prepare(preparing("u2", "foo0"))
    await p.unprepare(claims.ClaimUID("u1"))
    await p.prepare(preparing("u2", "foo0"))
    assert p.holder("foo0") == "u2"


async def test_missing_device_and_foreign_pool_fail(root: pathlib.Path) -> None:
    make_tree(root)
    p = policy(root)
    with pytest.raises(ValueError, match="not present"):
        await p.prepare(preparing("u", "foo9"))
    other = owners.PreparingClaim(
        ref=claims.ClaimRef("ns", "c", claims.ClaimUID("u")),
        results=({"request": "r", "driver": "d", "pool": "node-b", "device": "foo0"},),
        configs=(),
    )
    with pytest.raises(ValueError, match="pool node-b"):
        await p.prepare(other)


async def test_prepare_probes_its_devices_and_scans_only_for_a_new_one(
    root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(root, count=8)
    p = policy(root)
    assert len(p.devices()) == 8
    scans = 0
    scan = p._scan

    def counted() -> dict[str, kmod.KmodDevice]:
        nonlocal scans
        scans += 1
        return scan()

    monkeypatch.setattr(p, "_scan", counted)
    for i in range(4):
        await p.prepare(preparing(f"u{i}", f"foo{i}"))
    assert scans == 0  # each prepare looked at its own device only
    (root / "dev/foo5").unlink()  # gone since the last scan: probed, not trusted
    with pytest.raises(ValueError, match="foo5 is not present"):
        await p.prepare(preparing("u5", "foo5"))
    assert scans == 1  # a device that is not where it was: the scan decides
    make_tree(root, count=9)  # foo8 appears (and foo5 is back)
    (allocation,) = await p.prepare(preparing("u8", "foo8"))
    assert allocation.device_name == "foo8"
    assert scans == 2


async def test_the_cdi_host_path_is_the_nodes_when_its_dev_is_mounted_elsewhere(
    root: pathlib.Path,
) -> None:
    # In a container: the node's /dev at <root>/dev (say /host/dev), which
    # the runtime reading the spec on the node knows as /dev.
    make_tree(root)
    p = policy(root, sys_dir=root / "sys", dev_dir=root / "dev")
    (allocation,) = await p.prepare(preparing("u1", "foo1"))
    (node,) = allocation.edits["deviceNodes"]
    assert (node["path"], node.get("hostPath")) == ("/dev/foo1", "/dev/foo1")


def test_restore_relearns_holders(root: pathlib.Path) -> None:
    make_tree(root)
    p = policy(root)
    device = checkpointing.PreparedDevice(("r",), "node-a", "foo1", ("x",), {})
    p.restore({claims.ClaimUID("u"): [device]})
    assert p.holder("foo1") == "u"


async def test_a_disappearing_device_is_reported_unhealthy(root: pathlib.Path) -> None:
    make_tree(root)
    p = policy(root, poll_interval=3600)
    stream = p.watch_health()
    try:
        first = await asyncio.wait_for(anext(stream), timeout=10)
        assert {(r.device_name, r.health) for r in first} == {
            ("foo0", owners.Health.HEALTHY),
            ("foo1", owners.Health.HEALTHY),
        }
        (root / "dev/foo1").unlink()
        p.poke()
        second = await asyncio.wait_for(anext(stream), timeout=10)
        assert {(r.device_name, r.health) for r in second} == {
            ("foo0", owners.Health.HEALTHY),
            ("foo1", owners.Health.UNHEALTHY),
        }
        assert "disappeared" in next(r.message for r in second if r.device_name == "foo1")
    finally:
        await stream.aclose()


async def test_unchanged_health_is_sent_again_within_the_kubelets_timeout(
    root: pathlib.Path,
) -> None:
    # The kubelet holds a report only for its timeout: a steady device must be
    # reported again before then, or it reads Unknown.
    make_tree(root)
    p = policy(root, poll_interval=0.05)
    stream = p.watch_health()
    try:
        first = await asyncio.wait_for(anext(stream), timeout=10)
        again = await asyncio.wait_for(anext(stream), timeout=10)
        assert [(r.device_name, r.health) for r in again] == [
            (r.device_name, r.health) for r in first
        ]
        assert all(r.timeout_seconds >= 30 for r in again)  # never below the kubelet's default
    finally:
        await stream.aclose()


async def _next_health(
    stream: AsyncIterator[Sequence[owners.DeviceHealthReport]],
) -> dict[str, tuple[owners.Health, str]]:
    reports = await asyncio.wait_for(anext(stream), timeout=10)
    return {r.device_name: (r.health, r.message) for r in reports}


async def test_every_device_is_unhealthy_while_its_module_is_unloaded(
    root: pathlib.Path,
) -> None:
    make_tree(root)
    (root / "sys/module/foo/initstate").write_text("live\n")
    (root / "proc/modules").write_text("foo 16384 0 - Live 0x0\n")
    p = policy(root, poll_interval=3600, kernel_module="foo")
    stream = p.watch_health()
    healthy = {name: (owners.Health.HEALTHY, "") for name in ("foo0", "foo1")}
    try:
        assert await _next_health(stream) == healthy
        # rmmod: the module leaves sysfs and /proc/modules; the /dev nodes
        # are left behind here, and count for nothing without their module.
        shutil.rmtree(root / "sys/module/foo")
        (root / "proc/modules").write_text("")
        p.poke()
        gone = f"kernel module foo is not loaded ({root}/sys/module/foo is gone)"
        assert await _next_health(stream) == {
            "foo0": (owners.Health.UNHEALTHY, gone),
            "foo1": (owners.Health.UNHEALTHY, gone),
        }
        # Loaded again: healthy again.
        make_tree(root)
        (root / "sys/module/foo/initstate").write_text("live\n")
        (root / "proc/modules").write_text("foo 16384 0 - Live 0x0\n")
        p.poke()
        assert await _next_health(stream) == healthy
    finally:
        await stream.aclose()


async def test_proc_modules_without_the_module_makes_its_devices_unhealthy(
    root: pathlib.Path,
) -> None:
    make_tree(root)
    (root / "sys/module/foo/initstate").write_text("live\n")
    (root / "proc/modules").write_text("bar 100 0 - Live 0x0\n")
    reports = policy(root, kernel_module="foo").health()
    assert {r.health for r in reports} == {owners.Health.UNHEALTHY}
    assert all("does not list it" in r.message for r in reports)


def test_without_a_kernel_module_only_the_dev_nodes_count(root: pathlib.Path) -> None:
    make_tree(root)
    shutil.rmtree(root / "sys/module/foo")
    reports = policy(root).health()
    assert {r.health for r in reports} == {owners.Health.HEALTHY}


async def test_a_new_cause_is_sent_at_once(root: pathlib.Path) -> None:
    # Unhealthy either way, but the kubelet shows the message: a device whose
    # node went first and whose module went after is reported again at once.
    make_tree(root)
    p = policy(root, poll_interval=3600, kernel_module="foo")
    stream = p.watch_health()
    try:
        await _next_health(stream)
        (root / "dev/foo0").unlink()
        (root / "dev/foo1").unlink()
        p.poke()
        assert (await _next_health(stream))["foo1"] == (
            owners.Health.UNHEALTHY,
            "/dev/foo1 disappeared",
        )
        shutil.rmtree(root / "sys/module/foo")
        p.poke()
        health, message = (await _next_health(stream))["foo1"]
        assert (health, message.split(" (")[0]) == (
            owners.Health.UNHEALTHY,
            "kernel module foo is not loaded",
        )
    finally:
        await stream.aclose()
