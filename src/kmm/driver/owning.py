"""The node driver: the owner of the kubelet plugin (seed 001's resource manager).

``Driver`` holds the lock every kubelet request takes, commits prepared and
released claims (``claim_allocated`` / ``claim_released``), and owns the
shutdown path: ``request_shutdown(reason)`` - called by the plugin from a
failing task, or by the SIGTERM handler - only records the reason and wakes
``run``, which then stops the plugin from its own task and with the lock
released. Both ways in therefore shut down identically, and the plugin is
never stopped from the task whose failure asked for it.

``run`` decides whether DRA is on (``config.decide_dra``), starts the
plugin, publishes the policy's devices, rescans them periodically
(republishing on change), allows claims once the owner is synchronized,
and waits for the shutdown request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kmm.aio import tasks
from kmm.driver import config as configuration
from kmm.driver import kmod
from kmm.kube import client
from kmm.kubeletplugin import claimcache, claims, plugins, publishing

__all__ = ["Driver"]

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

    # -- owners.Owner ----------------------------------------------------------

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        # kmod devices need no state beyond the policy's and the checkpoint;
        # the hook is where a richer owner would push the change to containers.
        self.committed[claim.uid] = claim
        logger.info("claim %s/%s prepared", claim.namespace, claim.name)

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        self.committed.pop(claim.uid, None)
        logger.info("claim %s/%s released", claim.namespace, claim.name)

    def request_shutdown(self, reason: str) -> None:
        """Ask ``run`` to shut down; returns at once (never stops anything itself)."""
        if self.shutdown_reason is None:
            self.shutdown_reason = reason
            logger.warning("shutdown requested: %s", reason)
        self._shutdown.set()

    # -- configuration -------------------------------------------------------

    def reconfigure(self, new: configuration.Config) -> None:
        """Apply a new configuration; changes that need a restart are refused."""
        configuration.check_reconfigure(self.config, new)
        self.config = new

    # -- lifecycle -------------------------------------------------------------

    async def run(
        self, *, install_signals: Callable[[Callable[[str], None]], None] | None = None
    ) -> str:
        """Run until a shutdown is requested; return its reason."""
        if install_signals is not None:
            install_signals(self.request_shutdown)
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
            paths=plugins.Paths.under(self.config.root, self.config.driver_name),
            api=self._api,
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

    def _background_error(self, error: BaseException, message: str) -> None:
        if self.plugin is not None:
            self.plugin.handle_error(error, message)
        else:
            self.request_shutdown(f"{message}: {error}")

    async def _rescan(self, plugin: plugins.Plugin, devices: list[publishing.Device]) -> None:
        while True:
            await asyncio.sleep(self._rescan_interval)
            current = list(self.policy.devices())
            if current != devices:
                devices = current
                plugin.publish(devices)
