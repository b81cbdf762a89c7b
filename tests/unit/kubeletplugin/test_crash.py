"""The plugin process killed between its CDI write and its checkpoint write.

A real plugin runs in a subprocess whose crash point SIGKILLs it; the test
plays the kubelet, then starts a fresh plugin on the same directories and
checks the state is consistent and a re-prepare answers the same devices.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
import textwrap

import grpc
import pytest

from kmm.kubeletplugin import checkpointing, claimcache, claims, plugins

from . import fakes
from .kubelet import Kubelet, devices_of

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, pathlib, signal, sys
    sys.path.insert(0, sys.argv[1])
    from kubeletplugin import fakes
    from kmm.kubeletplugin import claimcache, plugins

    root, claim_file, point = pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]

    def crash(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        source = claimcache.StaticClaims([json.loads(pathlib.Path(claim_file).read_text())])
        plugin = plugins.Plugin(
            fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
            claim_source=source, paths=plugins.Paths.under(root, fakes.DRIVER), crash_point=crash,
        )
        await plugin.start()
        plugin.allow_claims()
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("point", ["cdi-written", "before-checkpoint-completed"])
async def test_killed_between_cdi_and_checkpoint_then_restarted(
    root: pathlib.Path, point: str
) -> None:
    claim = fakes.make_claim("victim", devices=("dev0", "dev1"))
    uid = claims.ClaimUID(claim["metadata"]["uid"])
    claim_file = root / "claim.json"
    claim_file.write_text(json.dumps(claim))
    paths = plugins.Paths.under(root, fakes.DRIVER)
    reg = paths.registration_socket(fakes.DRIVER)
    tests_dir = pathlib.Path(__file__).resolve().parent.parent
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRIPT, str(tests_dir), str(root), str(claim_file), point
    )
    try:
        for _ in range(3000):  # bounded wait for the child's sockets
            if reg.exists() or process.returncode is not None:
                break
            await asyncio.sleep(0.01)
        assert reg.exists(), "the plugin process did not come up"
        async with Kubelet(reg) as kubelet:
            with pytest.raises(grpc.aio.AioRpcError):
                await kubelet.prepare(claim)
        assert await asyncio.wait_for(process.wait(), timeout=30) == -9
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    # What the killed process left: the CDI spec, and a checkpoint saying "started".
    spec = paths.cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"
    assert spec.exists()
    left = checkpointing.Checkpoint(paths.plugin_data_dir)
    left.load()
    assert left.claims[uid].state == checkpointing.STARTED

    policy = fakes.FakePolicy()
    plugin = plugins.Plugin(
        fakes.DRIVER,
        node=fakes.NODE,
        owner=fakes.FakeOwner(),
        policy=policy,
        claim_source=claimcache.StaticClaims([claim]),
        paths=paths,
    )
    await plugin.start()  # stale sockets of the dead process are replaced
    plugin.allow_claims()
    try:
        assert policy.restored == {}  # nothing was completed
        async with Kubelet(reg) as kubelet:
            first = (await kubelet.prepare(claim))[uid]
            again = (await kubelet.prepare(claim))[uid]
        assert first.error == ""
        assert devices_of(first) == devices_of(again)
        assert [d[1] for d in devices_of(first)] == ["dev0", "dev1"]
        assert [d[3] for d in devices_of(first)] == [
            [f"{fakes.DRIVER}/claim={uid}-0"],
            [f"{fakes.DRIVER}/claim={uid}-1"],
        ]
        assert plugin.prepared()[uid].state == checkpointing.COMPLETED
        assert policy.prepare_calls == 1
        assert [p.name for p in paths.cdi_dir.iterdir()] == [spec.name]
    finally:
        await plugin.stop()
    after = checkpointing.Checkpoint(paths.plugin_data_dir)
    after.load()
    assert after.claims[uid].state == checkpointing.COMPLETED
