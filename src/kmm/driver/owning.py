"""The node driver: the owner of the kubelet plugin (seed 001's resource manager).

``Driver`` holds the lock every kubelet request takes, commits prepared and
released claims (``claim_allocated`` / ``claim_released``), and owns the
shutdown path: ``request_shutdown(reason)`` - called by the plugin from a
failing task, or by the SIGTERM handler - only records the reason and wakes
``run``, which then stops the plugin from its own task and with the lock
released. Both ways in therefore shut down identically, and the plugin is
never stopped from the task whose failure asked for it.

``run`` decides whether DRA is on (``config.decide_dra``), serves the gRPC
health service on ``health_port`` (``liveness``: SERVING while the driver
runs; ``READINESS``, the server as a whole: SERVING while the kubelet's last
``NotifyRegistrationStatus`` said registered; both NOT_SERVING as it
stops), starts the plugin, publishes the policy's devices, rescans them
periodically (republishing on change), allows claims once the owner is
synchronized, and waits for the shutdown request.

Readiness is the empty service name because drivers written for upstream
KMM's DaemonSet serve it: gRPC's health servers (Go's, Java's, Python's)
answer it SERVING from their start, and the Kubernetes dra-example-driver
answers it as it answers ``liveness`` (its sockets respond). The operator's
readiness probe asks for it (``operator.dra.builders``), so those drivers
are Ready as before and kmm's is Ready once the kubelet registered it.

``reconfigure`` applies a new configuration where it can (device discovery,
scan interval, log level) and refuses what needs a restart: the refusal is
logged and, with cluster access, given to the Node as a Warning Event
(reason ``RestartRequired``), and the driver keeps running as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable

import grpc
from grpc import aio
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kmm.aio import tasks
from kmm.driver import config as configuration
from kmm.driver import kmod
from kmm.kube import client, errors, resources
from kmm.kubeletplugin import claimcache, claims, plugins, publishing

__all__ = ["LIVENESS", "READINESS", "Driver"]

LIVENESS = "liveness"  # the service name the DaemonSet's liveness probe asks for
READINESS = ""  # its readiness probe's: the server as a whole

logger = logging.getLogger(__name__)


class Driver:
    """Owns the lock, the commit hooks, the shutdown path and the plugin."""

    def __init__(
        self,
        config: configuration.Config,
        *,
        policy: kmod.KmodPolicy,
        api: client.Client | None,
        claim_source: claimcache.ClaimSource | None = None,
        rescan_interval: float = 10.0,
    ) -> None:
        self.config = config
        self.policy = policy
        self._api = api
        self._claim_source = claim_source
        self._rescan_interval = rescan_interval
        self._lock = asyncio.Lock()
        self._shutdown = asyncio.Event()
        self.shutdown_reason: str | None = None
        self.plugin: plugins.Plugin | None = None
        self.committed: dict[claims.ClaimUID, claims.ClaimRef] = {}
        self.decision: configuration.Decision | None = None
        self.started = asyncio.Event()
        self._rescan_now = asyncio.Event()
        self._events: set[asyncio.Task[None]] = set()
        self.health = health_aio.HealthServicer()
        self.health_server: aio.Server | None = None
        self.health_port: int | None = None  # bound, once serving

    # -- owners.Owner ----------------------------------------------------------

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        # kmod devices need no state beyond the policy's and the checkpoint;
        # the hook is where a richer owner would push the change to containers.
        # (The plugin logs what each call prepared and released.)
        self.committed[claim.uid] = claim

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        self.committed.pop(claim.uid, None)

    def request_shutdown(self, reason: str) -> None:
        """Ask ``run`` to shut down; returns at once (never stops anything itself)."""
        if self.shutdown_reason is None:
            self.shutdown_reason = reason
            logger.warning("shutdown requested: %s", reason)
        self._shutdown.set()

    # -- configuration -------------------------------------------------------

    def reconfigure(self, new: configuration.Config) -> bool:
        """Apply a new configuration; a change that needs a restart is refused
        (logged, and a Warning Event on the Node) and nothing is changed."""
        try:
            configuration.check_reconfigure(self.config, new)
        except configuration.ConfigError as err:
            logger.warning("configuration change refused: %s", err)
            self._warn_node("RestartRequired", f"kmm driver {self.config.driver_name}: {err}")
            return False
        self.config = new
        self.policy.update(
            device_class=new.device_class,
            dev_pattern=new.dev_pattern,
            poll_interval=new.poll_interval,
        )
        self._rescan_interval = new.poll_interval
        logging.getLogger("kmm").setLevel(
            logging.DEBUG if new.log_level == "debug" else logging.INFO
        )
        self._rescan_now.set()
        logger.info("configuration applied")
        return True

    def _warn_node(self, reason: str, message: str) -> None:
        if self._api is None:
            return
        task = asyncio.get_running_loop().create_task(self._post_node_event(reason, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _post_node_event(self, reason: str, message: str) -> None:
        assert self._api is not None
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            node = await self._api.request("GET", resources.NODES.path(name=self.config.node))
            await self._api.request(
                "POST",
                resources.EVENTS.path("default"),
                body={
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{self.config.node}."},
                    "involvedObject": {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.config.node,
                        "uid": node["metadata"]["uid"],
                    },
                    "reason": reason,
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "kmm-driver", "host": self.config.node},
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
            )
        except errors.ApiError as err:
            logger.warning(
                "could not record the %s Event on node %s: %s", reason, self.config.node, err
            )

    # -- lifecycle -------------------------------------------------------------

    async def run(
        self, *, install_signals: Callable[[Callable[[str], None]], None] | None = None
    ) -> str:
        """Run until a shutdown is requested; return its reason."""
        if install_signals is not None:
            install_signals(self.request_shutdown)
        if self.config.health_port is not None:
            await self._serve_health(self.config.health_port)
        try:
            return await self._run()
        finally:
            await self._stop_health()

    async def _serve_health(self, port: int) -> None:
        server = aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            self.health_port = server.add_insecure_port(f"0.0.0.0:{port}")
        except RuntimeError as err:
            raise configuration.ConfigError(f"health port {port}: {err}") from err
        await server.start()
        self.health_server = server
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        # Not ready until the kubelet says it registered the plugin.
        await self.health.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)
        logger.info("gRPC health (liveness, readiness) on port %d", self.health_port)

    def _registration(self, registered: bool) -> None:
        """The kubelet's registration status: readiness follows it."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if registered
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        tasks.guard(
            self.health.set(READINESS, status), name="readiness", on_error=self._background_error
        )

    async def _stop_health(self) -> None:
        if self.health_server is None:
            return
        await self.health.enter_graceful_shutdown()
        with contextlib.suppress(grpc.RpcError):
            await self.health_server.stop(grace=1.0)

    async def _run(self) -> str:
        self.decision = configuration.decide_dra(
            self.config.dra,
            policy_wants=self.policy.wants_dra,
            cluster_access=self._api is not None,
        )
        if self.decision.warning:
            logger.warning("%s", self.decision.warning)
        if not self.decision.enabled:
            logger.info("DRA is off: %s", self.decision.reason)
            self.started.set()
            await self._shutdown.wait()
            return self.shutdown_reason or ""
        assert self._api is not None
        source = self._claim_source or claimcache.ClaimCache(
            self._api, on_error=self._background_error
        )
        plugin = plugins.Plugin(
            self.config.driver_name,
            node=self.config.node,
            owner=self,
            policy=self.policy,
            claim_source=source,
            paths=self._paths(),
            api=self._api,
            on_registration=self._registration,
        )
        self.plugin = plugin
        devices = list(self.policy.devices())
        plugin.publish(devices)
        rescanning: asyncio.Task[None] | None = None
        try:
            await plugin.start()
            # Nothing to synchronize with a container runtime for kmod devices:
            # the checkpoint, loaded by start(), is our whole state.
            plugin.allow_claims()
            rescanning = tasks.guard(
                self._rescan(plugin, devices), name="kmod-rescan", on_error=plugin.handle_error
            )
            self.started.set()
            await self._shutdown.wait()
        finally:
            await tasks.cancel(rescanning)
            # Stopped here, from run's own task and outside the lock (seed 001).
            await plugin.stop()
        return self.shutdown_reason or ""

    def _paths(self) -> plugins.Paths:
        standard = plugins.Paths.under(self.config.root, self.config.driver_name)
        return plugins.Paths(
            registrar_dir=self.config.registrar_dir or standard.registrar_dir,
            plugin_data_dir=(self.config.plugins_dir / self.config.driver_name)
            if self.config.plugins_dir
            else standard.plugin_data_dir,
            cdi_dir=self.config.cdi_dir or standard.cdi_dir,
        )

    def _background_error(self, error: BaseException, message: str) -> None:
        if self.plugin is not None:
            self.plugin.handle_error(error, message)
        else:
            self.request_shutdown(f"{message}: {error}")

    async def _rescan(self, plugin: plugins.Plugin, devices: list[publishing.Device]) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rescan_now.wait(), timeout=self._rescan_interval)
            self._rescan_now.clear()
            current = list(self.policy.devices())
            if current != devices:
                devices = current
                plugin.publish(devices)
