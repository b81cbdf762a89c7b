"""The emulator's plugin watcher against plugins on real unix sockets."""

from __future__ import annotations

import os
import shutil
import tempfile
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpcservers
import pytest
from grpc import aio

from kmm.kubelet import registration
from kmm.kubeletplugin.protos import pluginregistration_pb2, pluginregistration_pb2_grpc


class FakePlugin(pluginregistration_pb2_grpc.RegistrationServicer):
    """A registration socket answering GetInfo as told, recording what it is told."""

    def __init__(self, socket: Path, *, name: str, type_: str, versions: list[str]) -> None:
        self.socket, self.name, self.type, self.versions = socket, name, type_, versions
        self.statuses: list[tuple[bool, str]] = []
        self.server = aio.server()
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)

    async def start(self) -> None:
        self.server.add_insecure_port(f"unix://{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        await grpcservers.stop(self.server)
        self.socket.unlink(missing_ok=True)

    async def GetInfo(self, request: Any, context: Any) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=self.type,
            name=self.name,
            endpoint=str(self.socket.with_name("dra.sock")),
            supported_versions=self.versions,
        )

    async def NotifyRegistrationStatus(
        self, request: Any, context: Any
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.statuses.append((request.plugin_registered, request.error))
        return pluginregistration_pb2.RegistrationStatusResponse()


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))  # short: sockets live here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def watcher(directory: Path) -> AsyncIterator[registration.PluginWatcher]:
    registry = registration.Registry()
    try:
        yield registration.PluginWatcher(directory, registry)
    finally:
        await registry.close()


async def _plugin(directory: Path, file: str, **kwargs: Any) -> FakePlugin:
    plugin = FakePlugin(directory / file, **kwargs)
    await plugin.start()
    return plugin


async def test_a_dra_plugin_is_registered_with_the_first_version_of_its_own_list(
    directory: Path, watcher: registration.PluginWatcher
) -> None:
    plugin = await _plugin(
        directory,
        "gpu.example.com-reg.sock",
        name="gpu.example.com",
        type_="DRAPlugin",
        versions=["v1beta1.DRAPlugin", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
    )
    try:
        await watcher.scan()
        assert plugin.statuses == [(True, "")]
        found = watcher.registry.plugin("gpu.example.com")
        assert found is not None
        assert found.service == "v1beta1.DRAPlugin"
        assert found.endpoint == str(directory / "dra.sock")
        await watcher.scan()
        assert plugin.statuses == [(True, "")]  # registered once
    finally:
        await plugin.stop()


async def test_hidden_files_are_ignored(
    directory: Path, watcher: registration.PluginWatcher
) -> None:
    plugin = await _plugin(
        directory,
        ".staged-reg.sock",
        name="d.example.com",
        type_="DRAPlugin",
        versions=["v1.DRAPlugin"],
    )
    try:
        await watcher.scan()
        assert plugin.statuses == []
        assert watcher.registry.drivers() == []
    finally:
        await plugin.stop()


async def test_other_plugin_types_and_versions_are_refused_in_the_kubelets_words(
    directory: Path, watcher: registration.PluginWatcher
) -> None:
    csi = await _plugin(
        directory, "csi.sock", name="csi.example.com", type_="CSIPlugin", versions=["1.0.0"]
    )
    old = await _plugin(
        directory, "old.sock", name="old.example.com", type_="DRAPlugin", versions=["v1alpha4"]
    )
    try:
        await watcher.scan()
        ((ok, error),) = csi.statuses
        assert not ok
        assert error == (
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin "
            f"at socket {csi.socket}"
        )
        ((ok, error),) = old.statuses
        assert not ok
        assert error.startswith("RegisterPlugin error -- plugin validation failed with err: ")
        assert "none of services supported by the plugin" in error
        assert watcher.registry.drivers() == []
    finally:
        await csi.stop()
        await old.stop()


async def test_a_removed_socket_deregisters_and_a_recreated_one_registers_again(
    directory: Path, watcher: registration.PluginWatcher
) -> None:
    changes: list[str] = []
    watcher.registry.add_listener(changes.append)
    kwargs: dict[str, Any] = {
        "name": "d.example.com",
        "type_": "DRAPlugin",
        "versions": ["v1.DRAPlugin"],
    }
    first = await _plugin(directory, "d-reg.sock", **kwargs)
    await watcher.scan()
    await first.stop()
    await watcher.scan()
    assert watcher.registry.plugin("d.example.com") is None
    second = await _plugin(directory, "d-reg.sock", **kwargs)
    try:
        await watcher.scan()
        assert second.statuses == [(True, "")]
        assert watcher.registry.plugin("d.example.com") is not None
        assert changes == ["d.example.com"] * 3
    finally:
        await second.stop()


def test_service_choice() -> None:
    assert registration.choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    with pytest.raises(ValueError, match="empty list of supported gRPC services"):
        registration.choose_service([])


async def test_a_socket_recreated_within_one_poll_registers_again_even_on_its_old_inode(
    directory: Path, watcher: registration.PluginWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin that restarts between two polls often gets its socket's old
    # inode number back; the kubelet's inotify watch sees a new socket all the same.
    kwargs: dict[str, Any] = {"name": "d.example.com", "type_": "DRAPlugin"}
    first = await _plugin(directory, "d-reg.sock", versions=["v1.DRAPlugin"], **kwargs)
    await watcher.scan()
    inode = (directory / "d-reg.sock").stat().st_ino
    await first.stop()
    second = await _plugin(directory, "d-reg.sock", versions=["v1beta1.DRAPlugin"], **kwargs)
    real_scandir = os.scandir

    class SameInode:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self.entry, self.name, self.path = entry, entry.name, entry.path

        def stat(self, *, follow_symlinks: bool = True) -> types.SimpleNamespace:
            found = self.entry.stat(follow_symlinks=follow_symlinks)
            return types.SimpleNamespace(
                st_mode=found.st_mode, st_ino=inode, st_ctime_ns=found.st_ctime_ns
            )

    def scandir(path: Path) -> Iterator[SameInode]:
        with real_scandir(path) as entries:
            return iter([SameInode(e) for e in entries])

    monkeypatch.setattr(os, "scandir", scandir)
    try:
        await watcher.scan()
        assert second.statuses == [(True, "")]
        found = watcher.registry.plugin("d.example.com")
        assert found is not None
        assert found.service == "v1beta1.DRAPlugin"
    finally:
        await second.stop()
