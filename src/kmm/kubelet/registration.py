"""The kubelet's plugin watcher and DRA plugin registry, as the 1.37 kubelet behaves.

``PluginWatcher`` watches ``<root>/var/lib/kubelet/plugins_registry`` (a poll:
the standard library has no inotify) and, like the kubelet's plugin manager:

- ignores names starting with ``.`` and anything that is not a socket;
- for a new socket, dials it and calls ``GetInfo`` with a 1 s timeout; a
  plugin whose type is not ``DRAPlugin`` is told so through
  ``NotifyRegistrationStatus(false, "RegisterPlugin error -- no handler
  registered for plugin type: ...")``, one whose versions the emulator does not
  serve is told "plugin validation failed"; otherwise it is registered and
  told ``NotifyRegistrationStatus(true)``. A registration that fails (the
  socket does not answer yet, or the registry refuses it) is retried with
  backoff while the socket exists (1.37 forgets a refused plugin, so its
  reconciler tries again; 1.35 kept it as registered);
- a socket that disappears is deregistered; one that is re-created (a new
  inode, or the same inode number with a new change time: a plugin that
  restarts within a poll gets its old number back from the filesystem) is
  deregistered and registered again, as the kubelet's inotify watch sees it.

A registered plugin's channel is watched: when its connection drops (the
plugin died, its socket left behind) the plugin is "not connected", and
the channel is asked to reconnect, as the kubelet's connection monitor does.

``Registry`` is the DRA handler's side: per driver, its plugins, each with the
service version chosen (the first of the plugin's own list that the emulator
supports: ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``), the health service chosen
the same way from ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``
(none when the plugin lists neither: 1.37 then opens no health stream, where
1.35 opened one to every plugin), and one gRPC channel used for every call to
it, health stream included. An endpoint already registered for the driver is
refused, as the kubelet does. Listeners hear every change (the slice wiper,
the health streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from kmm.aio import backoff
from kmm.kubeletplugin.protos import pluginregistration_pb2, pluginregistration_pb2_grpc

__all__ = [
    "DRA_PLUGIN_TYPE",
    "GET_INFO_TIMEOUT",
    "HEALTH_SERVICES",
    "SUPPORTED_SERVICES",
    "DRAPlugin",
    "PluginWatcher",
    "Registry",
    "choose_health_service",
    "choose_service",
]

_log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_SERVICES: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# The 1.37 kubelet's healthServicesSupportedByKubelet (cm/dra/plugin/dra_plugin.go),
# newest first; v1alpha1 is kept through 1.39 for older drivers.
HEALTH_SERVICES: Final = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
GET_INFO_TIMEOUT: Final = 1.0  # the kubelet's, for GetInfo
_NOTIFY_TIMEOUT: Final = 5.0


def choose_service(supported: list[str]) -> str:
    """The first of the plugin's services the emulator serves; ValueError with
    the kubelet's words when there is none."""
    if not supported:
        raise ValueError("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in SUPPORTED_SERVICES:
            return service
    raise ValueError(
        f"none of services supported by the plugin ({supported!r}) are supported "
        f"by the kubelet ({list(SUPPORTED_SERVICES)!r})"
    )


def choose_health_service(supported: list[str]) -> str:
    """``pickHealthService``: the newest health service the plugin lists, or "" for none."""
    for service in HEALTH_SERVICES:
        if service in supported:
            return service
    return ""


def channel_to(endpoint: str) -> aio.Channel:
    # A private subchannel pool: a plugin that restarts on the same path must
    # not be handed the dead process's connection from gRPC's shared pool.
    return aio.insecure_channel(
        f"unix://{endpoint}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


@dataclasses.dataclass
class DRAPlugin:
    """One registered plugin of a driver: where it serves and how we talk to it."""

    driver: str
    endpoint: str
    socket: Path
    service: str
    channel: aio.Channel
    # The health service chosen at registration ("": no health stream).
    health_service: str = ""
    # Whether the channel is connected now (READY), as the kubelet's
    # connection monitor sees it; kept by Registry's monitor task.
    connected: bool = False
    monitor: asyncio.Task[None] | None = None

    @property
    def version(self) -> str:
        """``v1`` or ``v1beta1``: which generated stubs to use."""
        return self.service.split(".", 1)[0]


Listener = Callable[[str], None]  # called with the driver name after any change


class Registry:
    """Registered DRA plugins by driver (the newest serves calls)."""

    def __init__(self) -> None:
        self._plugins: dict[str, list[DRAPlugin]] = {}
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def plugin(self, driver: str) -> DRAPlugin | None:
        found = self._plugins.get(driver)
        return found[-1] if found else None

    def plugins(self, driver: str) -> list[DRAPlugin]:
        return list(self._plugins.get(driver, ()))

    def drivers(self) -> list[str]:
        return sorted(d for d, plugins in self._plugins.items() if plugins)

    def usable(self, driver: str) -> bool:
        """Whether some plugin of ``driver`` is connected (the kubelet's test
        for wiping: a registered plugin whose process died is not)."""
        return any(p.connected for p in self._plugins.get(driver, ()))

    async def _monitor(self, plugin: DRAPlugin) -> None:
        """Follow the channel's state; ask it to reconnect whenever it drops,
        as the kubelet does, so a restarted plugin is noticed."""
        channel = plugin.channel
        state = channel.get_state(try_to_connect=True)
        while True:
            connected = state == grpc.ChannelConnectivity.READY
            if connected != plugin.connected:
                plugin.connected = connected
                _log.info("DRA plugin %s connected=%s", plugin.driver, connected)
                self._changed(plugin.driver)
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    def register(self, driver: str, endpoint: str, socket: Path, supported: list[str]) -> None:
        """Add a plugin; ValueError (the kubelet's words) when it cannot be."""
        service = choose_service(supported)
        plugins = self._plugins.setdefault(driver, [])
        if any(p.endpoint == endpoint for p in plugins):
            raise ValueError(
                f"endpoint {endpoint} already registered for DRA driver plugin {driver}"
            )
        plugin = DRAPlugin(
            driver=driver,
            endpoint=endpoint,
            socket=socket,
            service=service,
            channel=channel_to(endpoint),
            health_service=choose_health_service(supported),
        )
        plugins.append(plugin)
        plugin.monitor = asyncio.get_running_loop().create_task(
            self._monitor(plugin), name=f"dra-plugin-{driver}"
        )
        _log.info("registered DRA plugin %s at %s (%s)", driver, endpoint, service)
        self._changed(driver)

    async def deregister(self, socket: Path) -> None:
        """Remove the plugin that registered through ``socket``."""
        for driver, plugins in self._plugins.items():
            for plugin in [p for p in plugins if p.socket == socket]:
                plugins.remove(plugin)
                await _stop(plugin)
                _log.info("deregistered DRA plugin %s at %s", driver, plugin.endpoint)
                self._changed(driver)
                return

    async def close(self) -> None:
        for plugins in self._plugins.values():
            for plugin in plugins:
                await _stop(plugin)
        self._plugins.clear()

    def _changed(self, driver: str) -> None:
        for listener in self._listeners:
            listener(driver)


_CLOSE_TIMEOUT: Final = 2.0


async def close_channel(channel: aio.Channel) -> None:
    """Close a channel without waiting on it for ever: a channel to a plugin
    killed mid-call has been seen not to finish closing."""
    closing = asyncio.ensure_future(channel.close(None))
    done, _ = await asyncio.wait({closing}, timeout=_CLOSE_TIMEOUT)
    if not done:
        _log.warning("a gRPC channel did not close within %.0f s; left to finish", _CLOSE_TIMEOUT)


async def _stop(plugin: DRAPlugin) -> None:
    if plugin.monitor is not None:
        plugin.monitor.cancel()
        await asyncio.wait({plugin.monitor}, timeout=_CLOSE_TIMEOUT)
    await close_channel(plugin.channel)


@dataclasses.dataclass
class _Seen:
    identity: tuple[int, int]  # (inode, ctime in ns): what makes a socket a new one
    registered: bool = False
    delays: backoff.Backoff = dataclasses.field(
        default_factory=lambda: backoff.Backoff(initial=0.5, maximum=30.0)
    )
    retry_at: float = 0.0


class PluginWatcher:
    """Registers the plugins whose sockets appear in ``directory`` with ``registry``."""

    def __init__(self, directory: Path, registry: Registry, *, poll: float = 0.2) -> None:
        self.directory = directory
        self.registry = registry
        self.poll = poll
        self._seen: dict[Path, _Seen] = {}

    def _sockets(self) -> dict[Path, tuple[int, int]]:
        found: dict[Path, tuple[int, int]] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if entry.name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISSOCK(info.st_mode):
                        found[Path(entry.path)] = (info.st_ino, info.st_ctime_ns)
        return found

    async def scan(self) -> None:
        """One pass: deregister what went (or was re-created), register what is new."""
        now = asyncio.get_running_loop().time()
        present = self._sockets()
        for path, seen in list(self._seen.items()):
            if present.get(path) != seen.identity:
                del self._seen[path]
                if seen.registered:
                    await self.registry.deregister(path)
        for path, identity in sorted(present.items()):
            seen = self._seen.setdefault(path, _Seen(identity))
            if seen.registered or now < seen.retry_at:
                continue
            try:
                await self._register(path)
            except (grpc.RpcError, ValueError, OSError) as err:
                seen.retry_at = now + seen.delays.next()
                _log.warning("RegisterPlugin error at socket %s: %s", path, err)
            else:
                seen.registered = True

    def forget(self) -> None:
        """As a new kubelet process: every socket present is new again."""
        self._seen.clear()

    async def run(self) -> None:
        """Scan until cancelled."""
        while True:
            await self.scan()
            await asyncio.sleep(self.poll)

    async def _register(self, socket: Path) -> None:
        channel = channel_to(str(socket))
        try:
            async with asyncio.timeout(GET_INFO_TIMEOUT + 2 * _NOTIFY_TIMEOUT):
                await self._register_on(channel, socket)
        except TimeoutError as err:
            raise OSError(f"registration through {socket} did not finish") from err
        finally:
            await close_channel(channel)

    async def _register_on(self, channel: aio.Channel, socket: Path) -> None:
        # The generated stubs are typed for the sync API; this is the aio one.
        stub: Any = pluginregistration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
        if info.type != DRA_PLUGIN_TYPE:
            message = (
                f"RegisterPlugin error -- no handler registered for plugin type: "
                f"{info.type} at socket {socket}"
            )
            await _notify(stub, False, message)
            raise ValueError(message)
        endpoint = info.endpoint or str(socket)
        try:
            choose_service(list(info.supported_versions))
        except ValueError as err:
            await _notify(
                stub, False, f"RegisterPlugin error -- plugin validation failed with err: {err}"
            )
            raise
        try:
            self.registry.register(info.name, endpoint, socket, list(info.supported_versions))
        except ValueError as err:
            await _notify(
                stub,
                False,
                f"RegisterPlugin error -- plugin registration failed with err: {err}",
            )
            raise
        try:
            await _notify(stub, True, "")
        except grpc.RpcError:
            await self.registry.deregister(socket)  # registered again on the retry
            raise


async def _notify(stub: Any, ok: bool, error: str) -> None:
    await stub.NotifyRegistrationStatus(
        pluginregistration_pb2.RegistrationStatus(plugin_registered=ok, error=error),
        timeout=_NOTIFY_TIMEOUT,
    )
