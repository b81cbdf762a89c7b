"""The node driver end to end on a fake host tree, a fake API and a test kubelet."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kubeletplugin import fakeapi, fakes
from kubeletplugin.kubelet import Kubelet, devices_of

from kmm.driver import config, kmod, owning
from kmm.kube import client
from kmm.kubelet import probes
from kmm.kubeletplugin import claimcache, errors, plugins

from .conftest import make_tree

DRIVER = "foo.example.com"


@pytest.fixture
async def api() -> AsyncIterator[tuple[client.Client, fakeapi.FakeAPI]]:
    fake = fakeapi.FakeAPI()
    async for started in fakeapi.started(fake):
        yield started, fake


def make_driver(
    root: pathlib.Path,
    api: client.Client | None,
    source: claimcache.StaticClaims,
    enabled: bool | None = None,
) -> owning.Driver:
    cfg = config.Config(
        node="node-a",
        driver_name=DRIVER,
        module="foo",
        device_class="foo",
        root=root,
        dra=config.DRAConfig(enabled=enabled),
    )
    policy = kmod.KmodPolicy(root=root, module="foo", node="node-a", device_class="foo")
    return owning.Driver(cfg, policy=policy, api=api, claim_source=source, rescan_interval=3600)


async def run_until_started(driver: owning.Driver) -> asyncio.Task[str]:
    task = asyncio.create_task(driver.run())
    await asyncio.wait_for(driver.started.wait(), timeout=20)
    return task


async def test_driver_publishes_prepares_and_shuts_down(
    root: pathlib.Path, api: tuple[client.Client, fakeapi.FakeAPI]
) -> None:
    client, fake = api
    make_tree(root)
    claim = fakes.make_claim("c", driver=DRIVER, devices=("foo1",))
    source = claimcache.StaticClaims([claim])
    driver = make_driver(root, client, source)
    task = await run_until_started(driver)
    paths = plugins.Paths.under(root, DRIVER)
    try:
        assert driver.plugin is not None
        assert driver.plugin.publisher is not None
        await asyncio.wait_for(driver.plugin.publisher.in_sync.wait(), timeout=20)
        published = [d["name"] for s in fake.slices.values() for d in s["spec"]["devices"]]
        assert published == ["foo0", "foo1"]
        async with Kubelet(paths.registration_socket(DRIVER)) as kubelet:
            uid = claim["metadata"]["uid"]
            answer = (await kubelet.prepare(claim))[uid]
            assert answer.error == ""
            assert devices_of(answer) == [("node-a", "foo1", ["req0"], [f"{DRIVER}/claim={uid}-0"])]
            spec = json.loads((paths.cdi_dir / f"{DRIVER}-claim_{uid}.json").read_text())
            (node,) = spec["devices"][0]["containerEdits"]["deviceNodes"]
            assert (node["path"], node["major"], node["minor"]) == ("/dev/foo1", 240, 1)
            assert uid in driver.committed
            assert (await kubelet.unprepare(claim))[uid] == ""
            assert uid not in driver.committed
    finally:
        driver.request_shutdown("SIGTERM")
        assert await asyncio.wait_for(task, timeout=30) == "SIGTERM"
    assert not paths.dra_socket.exists()
    assert not paths.registration_socket(DRIVER).exists()


async def test_a_fatal_plugin_error_shuts_down_through_the_same_path(
    root: pathlib.Path, api: tuple[client.Client, fakeapi.FakeAPI]
) -> None:
    client, _ = api
    make_tree(root)
    driver = make_driver(root, client, claimcache.StaticClaims())
    task = await run_until_started(driver)
    assert driver.plugin is not None
    driver.plugin.handle_error(errors.FatalError("grpc server gave up"), "serving")
    assert driver.plugin.started  # request_shutdown returned without stopping anything
    reason = await asyncio.wait_for(task, timeout=30)
    assert reason == "serving: grpc server gave up"
    assert not driver.plugin.started


async def test_no_cluster_access_keeps_dra_off(
    root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_tree(root)
    driver = make_driver(root, None, claimcache.StaticClaims())
    task = await run_until_started(driver)
    assert driver.plugin is None
    assert driver.decision is not None
    assert driver.decision.warning is not None
    assert "no cluster access" in caplog.text
    driver.request_shutdown("SIGTERM")
    assert await asyncio.wait_for(task, timeout=10) == "SIGTERM"
    assert not (root / "var").exists()


async def test_explicit_false_wins(
    root: pathlib.Path, api: tuple[client.Client, fakeapi.FakeAPI]
) -> None:
    client, fake = api
    make_tree(root)
    driver = make_driver(root, client, claimcache.StaticClaims(), enabled=False)
    task = await run_until_started(driver)
    assert driver.plugin is None
    driver.request_shutdown("SIGTERM")
    await asyncio.wait_for(task, timeout=10)
    assert fake.requests == {}


def test_reconfigure_refuses_dra_changes_and_keeps_running_as_it_was(
    root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver(root, None, claimcache.StaticClaims())
    before = driver.config
    new = dataclasses.replace(before, dra=config.DRAConfig(True), dev_pattern="foo1")
    assert driver.reconfigure(new) is False
    assert driver.config is before
    assert "needs a restart" in caplog.text


def test_reconfigure_applies_discovery_settings_at_once(root: pathlib.Path) -> None:
    make_tree(root)
    driver = make_driver(root, None, claimcache.StaticClaims())
    assert sorted(driver.policy.discover()) == ["foo0", "foo1"]
    assert driver.reconfigure(dataclasses.replace(driver.config, dev_pattern="foo1"))
    assert sorted(driver.policy.discover()) == ["foo1"]


async def test_the_health_service_answers_liveness_while_the_driver_runs(
    root: pathlib.Path,
) -> None:
    make_tree(root)
    cfg = dataclasses.replace(
        make_driver(root, None, claimcache.StaticClaims()).config, health_port=0
    )
    policy = kmod.KmodPolicy(root=root, module="foo", node="node-a", device_class="foo")
    driver = owning.Driver(cfg, policy=policy, api=None, rescan_interval=3600)
    task = await run_until_started(driver)
    assert driver.health_port
    probe = {"grpc": {"port": driver.health_port, "service": owning.LIVENESS}}
    assert await probes.check(probe, {}, _no_exec)
    assert not await probes.check(
        {"grpc": {"port": driver.health_port, "service": "x"}}, {}, _no_exec
    )
    driver.request_shutdown("test")
    assert await asyncio.wait_for(task, timeout=10) == "test"
    assert not await probes.check(probe, {}, _no_exec)  # gone with the driver


async def test_readiness_follows_the_kubelets_registration_status(
    root: pathlib.Path, api: tuple[client.Client, fakeapi.FakeAPI]
) -> None:
    """The DaemonSet's readiness probe asks the empty service: SERVING only
    while the kubelet's last NotifyRegistrationStatus said registered."""
    fake_client, _ = api
    make_tree(root)
    driver = make_driver(root, fake_client, claimcache.StaticClaims())
    driver.config = dataclasses.replace(driver.config, health_port=0)
    task = await run_until_started(driver)
    paths = plugins.Paths.under(root, DRIVER)
    assert driver.health_port
    readiness = {"grpc": {"port": driver.health_port}}
    liveness = {"grpc": {"port": driver.health_port, "service": owning.LIVENESS}}

    async def ready() -> bool:
        return await probes.check(readiness, {}, _no_exec)

    try:
        # Serving, but no kubelet has registered it: alive, not ready.
        assert await probes.check(liveness, {}, _no_exec)
        assert not await ready()
        async with Kubelet(paths.registration_socket(DRIVER)) as kubelet:
            await kubelet.get_info()
            assert not await ready()
            await kubelet.notify(True)
            assert await _eventually(ready)
            await kubelet.notify(False, "plugin name already registered")
            assert await _eventually(lambda: _not(ready))
            assert await probes.check(liveness, {}, _no_exec)
    finally:
        driver.request_shutdown("SIGTERM")
        await asyncio.wait_for(task, timeout=30)
    assert not await ready()


async def _not(check: Callable[[], Awaitable[bool]]) -> bool:
    return not await check()


async def _eventually(check: Callable[[], Awaitable[bool]]) -> bool:
    """The readiness set by the registration's handler lands on the loop's
    next turns; no timing involved (at most 100 turns)."""
    for _ in range(100):
        if await check():
            return True
        await asyncio.sleep(0)
    return False


async def _no_exec(argv: list[str], timeout: float) -> bool:
    raise AssertionError("no exec probe here")


async def test_cli_sigterm_takes_the_shutdown_path(root: pathlib.Path) -> None:
    make_tree(root)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from kmm.cli import main; main()",
        "driver",
        "--node=node-a",
        f"--driver-name={DRIVER}",
        "--module=foo",
        "--device-class=foo",
        f"--root={root}",
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        seen = b""
        while b"DRA is off" not in seen:  # no cluster access here
            line = await asyncio.wait_for(process.stderr.readline(), timeout=30)
            assert line, seen.decode()
            seen += line
        assert b"no cluster access" in seen
        process.terminate()
        rest = await asyncio.wait_for(process.stderr.read(), timeout=30)
        assert await process.wait() == 0
        assert b"driver stopped: SIGTERM" in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
