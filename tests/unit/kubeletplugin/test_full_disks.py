"""The plugin on filesystems that refuse writes: a full or read-only CDI
directory, and a full checkpoint directory.

Each is a tmpfs of a few pages mounted over the plugin's directory (as root,
which the test machine and CI are; a directory mode would not do, root
bypasses it), so the errors are the kernel's own: ENOSPC and EROFS. A claim
that cannot be written fails alone with an error naming the file, the
checkpoint on disk stays readable and equal to the plugin's memory, and the
claim succeeds once the way is clear.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest

from kmm.kubeletplugin import checkpointing, claimcache, claims, plugins

from . import fakes
from .kubelet import Kubelet

PAGE = 4096


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, *, pages: int) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={pages * PAGE},mode=0755", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"these tests mount a tmpfs, as root: {done.stderr}"
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def remount(path: pathlib.Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(directory: pathlib.Path) -> pathlib.Path:
    """Take every free page of the directory's filesystem; the file that holds them."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="No space left on device"):
            _write_pages_forever(fd)
    finally:
        os.close(fd)
    return filler


def _write_pages_forever(fd: int) -> None:
    while True:
        os.write(fd, b"\0" * PAGE)


class Node:
    def __init__(self, plugin: plugins.Plugin, source: claimcache.StaticClaims) -> None:
        self.plugin, self.source, self.paths = plugin, source, plugin.paths

    def claim(self, name: str, device: str) -> tuple[claims.ResourceClaim, claims.ClaimUID]:
        claim = fakes.make_claim(name, devices=(device,))
        self.source.put(claim)
        return claim, claims.ClaimUID(claim["metadata"]["uid"])

    def spec(self, uid: str) -> pathlib.Path:
        return self.paths.cdi_dir / f"{fakes.DRIVER}-claim_{uid}.json"

    def on_disk(self) -> dict[claims.ClaimUID, checkpointing.ClaimRecord]:
        saved = checkpointing.Checkpoint(self.paths.plugin_data_dir)
        saved.load(boot_id="boot")  # strict for this boot: damage would raise
        return saved.claims


@contextlib.asynccontextmanager
async def running(root: pathlib.Path) -> AsyncIterator[tuple[Node, Kubelet]]:
    source = claimcache.StaticClaims()
    plugin = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
        claim_source=source, paths=plugins.Paths.under(root, fakes.DRIVER), boot_id="boot",
    )  # fmt: skip
    await plugin.start()
    plugin.allow_claims()
    try:
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            yield Node(plugin, source), kubelet
    finally:
        await plugin.stop()


async def test_a_full_cdi_directory_fails_the_claim_until_space_is_back(
    root: pathlib.Path,
) -> None:
    cdi_dir = plugins.Paths.under(root, fakes.DRIVER).cdi_dir
    with tmpfs(cdi_dir, pages=4):
        async with running(root) as (node, kubelet):
            kept, kept_uid = node.claim("kept", "dev0")
            assert (await kubelet.prepare(kept))[kept_uid].error == ""
            filler = fill(cdi_dir)
            blocked, uid = node.claim("blocked", "dev1")
            error = (await kubelet.prepare(blocked))[uid].error
            assert f"cannot write CDI spec {node.spec(uid)}" in error
            assert "No space left on device" in error
            assert not node.spec(uid).exists()
            assert uid not in node.plugin.prepared()
            # On disk the failed claim is still "started" (cleaned up by a
            # restart or its retry); the prepared one is intact.
            assert node.on_disk()[kept_uid].state == checkpointing.COMPLETED
            assert node.on_disk()[uid].state == checkpointing.STARTED
            assert (await kubelet.prepare(kept))[kept_uid].error == ""
            filler.unlink()
            assert (await kubelet.prepare(blocked))[uid].error == ""
            assert node.spec(uid).exists()
            assert node.on_disk() == node.plugin.prepared()


async def test_a_read_only_cdi_directory_fails_prepare_and_unprepare_until_writable(
    root: pathlib.Path,
) -> None:
    cdi_dir = plugins.Paths.under(root, fakes.DRIVER).cdi_dir
    with tmpfs(cdi_dir, pages=16):
        async with running(root) as (node, kubelet):
            held, held_uid = node.claim("held", "dev0")
            assert (await kubelet.prepare(held))[held_uid].error == ""
            remount(cdi_dir, "ro")
            try:
                blocked, uid = node.claim("blocked", "dev1")
                error = (await kubelet.prepare(blocked))[uid].error
                assert f"cannot write CDI spec {node.spec(uid)}" in error
                assert "Read-only file system" in error
                # The release is recorded; the spec that cannot go is named.
                error = (await kubelet.unprepare(held))[held_uid]
                assert "Read-only file system" in error
                assert str(node.spec(held_uid)) in error
                assert held_uid not in node.plugin.prepared()
            finally:
                remount(cdi_dir, "rw")
            # Retried, as the kubelet does: the leftover spec goes.
            assert (await kubelet.unprepare(held))[held_uid] == ""
            assert not node.spec(held_uid).exists()
            assert (await kubelet.prepare(blocked))[uid].error == ""
            assert node.on_disk() == node.plugin.prepared()


async def test_a_full_checkpoint_directory_fails_the_claim_and_keeps_the_journal_whole(
    root: pathlib.Path,
) -> None:
    data_dir = plugins.Paths.under(root, fakes.DRIVER).plugin_data_dir
    with tmpfs(data_dir, pages=8):
        async with running(root) as (node, kubelet):
            filler = fill(data_dir)
            journal = data_dir / checkpointing.JOURNAL_NAME
            # The journal's last page has room for a few changes; the append
            # that needs a new page is refused and cut back.
            for attempt in range(PAGE // 64):
                claim, uid = node.claim(f"c{attempt}", "dev0")
                error = (await kubelet.prepare(claim))[uid].error
                if error:
                    break
                assert (await kubelet.unprepare(claim))[uid] == ""
            else:
                pytest.fail("the journal never ran out of space")
            assert f"cannot write checkpoint journal {journal}" in error
            assert "No space left on device" in error
            assert journal.read_bytes().endswith(b"\n")
            assert node.on_disk() == node.plugin.prepared()
            assert not node.spec(uid).exists() or uid in node.plugin.prepared()
            filler.unlink()
            assert (await kubelet.prepare(claim))[uid].error == ""
            assert node.on_disk() == node.plugin.prepared()
            assert node.on_disk()[uid].state == checkpointing.COMPLETED
    assert os.listdir(data_dir) == []  # the mount is gone, nothing written beneath it
