"""``kmm kubelet``: one node's kubelet, as far as DRA and the API can tell.

``Emulator.run`` registers the Node (``nodes``), wipes the node's
ResourceSlices (the kubelet does at start; ``slicewiping``), loads its
checkpoint, and then runs side by side: the heartbeat, the plugin watcher
(``registration``), the delayed wipe of a driver's slices when its last
plugin goes (cancelled when it comes back in time), and the pod loop, which
syncs the pods bound to the node (``podworkers``: started with their claims
prepared, completed, deleted, forgotten; their status written by
``podstatuses``).

With ``resource_health`` (the kubelet's ``ResourceHealthStatus`` gate, beta
and on by default since 1.36) a health stream is kept open to every plugin
that lists a health service (``health``) and each running container's
``allocatedResourcesStatus`` says the health of its claims' devices; the
pods holding a device are given a fresh status when its health changes,
when its report times out, and when its driver's stream ends (the kubelet
waits for the pod's next sync for the last two; the emulator does not, so
tests need not wait a minute).

``restart``, ``restart(reprepare=True)`` and ``restart(reboot=True)``
emulate a kubelet restart, the same with every running pod's claims
prepared again (a stricter test of a driver's idempotence), and a node
reboot on a running emulator (``kmm kubelet`` maps SIGHUP, SIGUSR2 and
SIGUSR1 to them). ``/metrics`` (``metrics``) counts and times the calls to drivers,
and counts pod syncs, the pods' prepares and unprepares, and how drivers'
absences ended.

Containers (``processes``): those of ``process_image`` (kmm's own image by
default) run as local processes, so their pods finish (Succeeded or Failed,
claims unprepared before the final phase is written, as the kubelet's
SyncTerminatingPod does) and their deletion waits for SIGTERM and the grace
period; the others run without a process until the pod is deleted.
Stopping the emulator stops its processes (no runtime outlives it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from kmm.aio import httpserving, tasks
from kmm.api import installation
from kmm.kube import client, listwatch, reflecting, resources
from kmm.kubelet import (
    checkpoint,
    dra,
    health,
    nodeoperations,
    nodes,
    podstatuses,
    podworkers,
    processes,
    registration,
    slicewiping,
)
from kmm.kubelet import metrics as kubelet_metrics

__all__ = ["Emulator", "Options"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    node: nodes.NodeSpec
    root: Path
    wipe_delay: float = 30.0  # the kubelet's defaultWipingDelay
    retry: float = 2.0  # between prepare attempts of a failing pod
    poll: float = 0.2  # the plugin watcher's
    # /metrics on 127.0.0.1:<port> (0: a free one, logged); None: not served.
    metrics_port: int | None = None
    # The kubelet's ResourceHealthStatus feature gate (beta, on since 1.36):
    # health streams and containerStatuses[].allocatedResourcesStatus.
    resource_health: bool = True
    health_retry: float = health.RETRY_PERIOD
    # Containers of this image run as local processes (None: none do).
    process_image: str | None = installation.IMAGE
    # The kubelet's DRAOptionalNodeOperations gate (alpha in 1.37, off):
    # devices may skip NodePrepareResources / NodeUnprepareResources, and the
    # Node declares the feature (nodeoperations).
    optional_node_operations: bool = False
    restart_backoff: float = 10.0  # the kubelet's initial CrashLoopBackOff
    volume_refresh: float = 60.0  # ConfigMap and Secret volumes rewritten this often

    @property
    def node_spec(self) -> nodes.NodeSpec:
        """The node as registered: its declared features follow the gates."""
        declared = set(self.node.declared_features)
        if self.optional_node_operations:
            declared.add(nodeoperations.FEATURE)
        return dataclasses.replace(self.node, declared_features=tuple(sorted(declared)))

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var" / "lib" / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "var" / "run" / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.kubelet_dir / "kmm-emulator"


class Emulator:
    def __init__(self, api: client.Client, options: Options) -> None:
        self.api = api
        self.options = options
        self.registry = registration.Registry()
        self.metrics = kubelet_metrics.Metrics()
        self.manager = dra.Manager(
            api,
            self.registry,
            checkpoint.Store(options.kubelet_dir),
            self.metrics,
            optional_node_operations=options.optional_node_operations,
        )
        self.metrics_server: httpserving.Server | None = None
        # Pod syncs and restarts take turns: a restart swaps the state a sync reads.
        self._turn = asyncio.Lock()
        self.watcher = registration.PluginWatcher(
            options.kubelet_dir / "plugins_registry", self.registry, poll=options.poll
        )
        self.pods = podworkers.PodSink()
        self.wiper = slicewiping.SliceWiper(
            api,
            node=options.node.name,
            registry=self.registry,
            counts=self.metrics,
            delay=options.wipe_delay,
            on_change=self.pods.changed.set,  # pods waiting for a driver may proceed
        )
        self.registry.add_listener(self.wiper.plugins_changed)
        self.health = health.Cache(options.kubelet_dir / health.FILE_NAME)
        self.workers = podworkers.PodWorkers(
            api,
            podworkers.Settings(
                node=options.node.name,
                retry=options.retry,
                state_dir=options.state_dir,
                run_settings=processes.Settings(
                    api=api,
                    root=options.root,
                    state_dir=options.state_dir,
                    server=api.access.server,
                    process_image=options.process_image,
                    backoff=options.restart_backoff,
                    volume_refresh=options.volume_refresh,
                ),
            ),
            pods=self.pods,
            manager=self.manager,
            statuses=podstatuses.StatusWriter(
                api,
                address=options.node.address,
                manager=self.manager,
                health_cache=self.health if options.resource_health else None,
            ),
            counts=self.metrics,
        )
        self.streams = (
            health.Streams(
                self.registry, self.health, self._health_changed, retry=options.health_retry
            )
            if options.resource_health
            else None
        )
        self._health_event = asyncio.Event()

    # -- health ----------------------------------------------------------

    def _holders(self, driver: str, keys: set[tuple[str, str]] | None) -> set[str]:
        """Pods holding a device of ``driver`` (any device when ``keys`` is None)."""
        found: set[str] = set()
        for info in self.manager.claims.values():
            for device in info.drivers.get(driver, ()):
                if keys is None or (device.pool_name, device.device_name) in keys:
                    found |= info.pod_uids
        return found

    def _health_changed(self, driver: str, changed: list[health.DeviceHealth]) -> None:
        keys = {(d.pool_name, d.device_name) for d in changed} if changed else None
        self.workers.refresh(self._holders(driver, keys))
        self._health_event.set()
        self.pods.changed.set()

    async def _health_clock(self) -> None:
        """Refresh the holders' status when a device's report times out."""
        while True:
            expiry = self.health.next_expiry()
            wait = None if expiry is None else max(0.0, expiry - self.health.clock()) + 0.05
            self._health_event.clear()
            try:
                await asyncio.wait_for(self._health_event.wait(), timeout=wait)
            except TimeoutError:
                for driver in list(self.health.drivers):
                    self.workers.refresh(self._holders(driver, None))
                self.pods.changed.set()

    # -- pods ------------------------------------------------------------

    async def sync_pods(self) -> None:
        await self.workers.sync()

    async def _pod_loop(self) -> None:
        await self.pods.synced.wait()
        while True:
            await self.pods.changed.wait()
            self.pods.changed.clear()
            async with self._turn:
                await self.sync_pods()
            self.metrics.pod_syncs.inc()

    async def restart(self, *, reboot: bool = False, reprepare: bool = False) -> None:
        """What a kubelet restart does to DRA: every plugin registered anew, the
        node's slices wiped, the checkpoint reloaded with every claim marked
        unprepared; containers keep running.

        As in 1.35 and 1.37, a running pod is not prepared again (the kubelet prepares
        only when it creates a pod's sandbox, and the sandboxes survive); a
        claim is sent again when a new pod uses it, so drivers must answer a
        second prepare of a claim they hold. ``reprepare`` is the stricter
        test: every running pod's claims are prepared again at once.
        ``reboot`` kills every container and empties the CDI directory (a
        tmpfs on real nodes) first: every pod starts again, its claims
        prepared again, and the drivers must rebuild their CDI specs."""
        async with self._turn:
            _log.info("emulating a kubelet %s", "reboot" if reboot else "restart")
            self.wiper.cancel()
            if self.streams is not None:
                await self.streams.close()
            await self.registry.close()
            self.watcher.forget()
            if reboot:
                await self.workers.kill()
                cdi = self.options.cdi_dir
                for entry in cdi.glob("*") if cdi.is_dir() else ():
                    entry.unlink(missing_ok=True)
            await self.wiper.wipe()
            self.manager.load()
            self.workers.restarted(start_again=reboot or reprepare)
        self.pods.changed.set()

    # -- the whole -------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        for path in (
            self.options.kubelet_dir / "plugins_registry",
            self.options.kubelet_dir / "plugins",
        ):
            path.mkdir(parents=True, exist_ok=True)
        node = await nodes.register(self.api, self.options.node_spec)
        await self.wiper.wipe()
        self.manager.load()
        reflector = reflecting.Reflector(
            "pods",
            listwatch.ApiListWatch(self.api, resources.PODS, kind="Pod"),
            self.pods,
            field_selector=f"spec.nodeName={self.options.node.name}",
            watch_timeout=240,
        )

        def failed(error: BaseException, what: str) -> None:
            _log.error("%s: %s", what, error)
            stop.set()

        if self.options.metrics_port is not None:
            self.metrics_server = httpserving.Server(
                "kubelet-metrics",
                "127.0.0.1",
                self.options.metrics_port,
                {"/metrics": self.metrics.scrape},
            )
        running = [
            *(
                [tasks.guard(self.metrics_server.run(stop), name="metrics", on_error=failed)]
                if self.metrics_server is not None
                else []
            ),
            tasks.guard(
                nodes.Heartbeat(self.api, self.options.node_spec, node["metadata"]["uid"]).run(),
                name="heartbeat",
                on_error=failed,
            ),
            tasks.guard(self.watcher.run(), name="plugin-watcher", on_error=failed),
            tasks.guard(reflector.run(), name="pods", on_error=failed),
            tasks.guard(self._pod_loop(), name="pod-loop", on_error=failed),
            *(
                [tasks.guard(self._health_clock(), name="health-clock", on_error=failed)]
                if self.streams is not None
                else []
            ),
        ]
        try:
            await stop.wait()
        finally:
            ending = [*running, *self.wiper.pending()]
            for task in ending:
                task.cancel()
            _, stuck = await asyncio.wait(ending, timeout=10)
            for task in stuck:
                _log.error("task %s did not end when cancelled", task.get_name())
            # No runtime keeps these processes once the emulator is gone.
            await self.workers.stop()
            if self.streams is not None:
                await self.streams.close()
            await self.registry.close()
            # Stopping the processes above may have dropped plugins: their
            # delayed wipes end with the emulator too.
            wipes = self.wiper.pending()
            for task in wipes:
                task.cancel()
            await asyncio.gather(*wipes, return_exceptions=True)
