"""``kmm kubelet``: one node's kubelet, as far as DRA and the API can tell.

``Emulator.run`` registers the Node (``nodes``), wipes the node's
ResourceSlices (the kubelet does at start), loads its checkpoint, and then
runs side by side: the heartbeat, the plugin watcher (``registration``), the
delayed wipe of a driver's slices when its last plugin goes (cancelled when
it comes back in time), and the pod loop. The pod loop watches the pods bound
to the node and, for each:

- a pod to start: its claims prepared (``dra.Manager``); on failure a Warning
  Event ``FailedPrepareDynamicResources`` ("Failed to prepare dynamic
  resources: ...") and a retry after ``retry`` seconds, the pod staying
  Pending; on success each container's CDI device ids recorded (there is no
  runtime: ``containers.json`` under the emulator's state dir says what a
  runtime would have been given) and its containers started, the status
  following them;
- a pod whose containers are all done for good: its claims unprepared, then
  its final phase written;
- a pod being deleted: its containers stopped (SIGTERM, SIGKILL after the
  grace period), then its claims unprepared (retried until the driver
  answers), and only then is the pod deleted for good, as the kubelet does;
- a pod gone without that (force-deleted): its processes killed and its
  claims unprepared from the cache all the same.

A driver's slices are wiped ``wipe_delay`` after none of its plugins is
usable any more: deregistered, or its connection lost (a driver killed
leaves its socket behind), unless one is usable again by then.

With ``resource_health`` (the kubelet's ``ResourceHealthStatus`` gate, off
by default as in 1.35) a health stream is kept open to every plugin
(``health``) and each running container's ``allocatedResourcesStatus`` says
the health of its claims' devices; the pods holding a device are given a
fresh status when its health changes, when its report times out, and when
its driver's stream ends (the kubelet waits for the pod's next sync for the
last two; the emulator does not, so tests need not wait a minute).

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
import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kmm.aio import httpserving, tasks
from kmm.api import installation
from kmm.kube import client, errors, listwatch, objects, reflecting, resources
from kmm.kubelet import checkpoint, dra, health, nodes, processes, registration
from kmm.kubelet import metrics as kubelet_metrics

__all__ = ["Emulator", "Options"]

_log = logging.getLogger(__name__)

# How a driver's absence ended when it came back in time: the outcome label,
# and the cancellation message of its pending wipe.
_RETURNED = "returned"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Options:
    node: nodes.NodeSpec
    root: Path
    wipe_delay: float = 30.0  # the kubelet's defaultWipingDelay
    retry: float = 2.0  # between prepare attempts of a failing pod
    poll: float = 0.2  # the plugin watcher's
    # /metrics on 127.0.0.1:<port> (0: a free one, logged); None: not served.
    metrics_port: int | None = None
    # The kubelet's ResourceHealthStatus feature gate: health streams and
    # containerStatuses[].allocatedResourcesStatus.
    resource_health: bool = False
    health_retry: float = health.RETRY_PERIOD
    # Containers of this image run as local processes (None: none do).
    process_image: str | None = installation.IMAGE
    restart_backoff: float = 10.0  # the kubelet's initial CrashLoopBackOff
    volume_refresh: float = 60.0  # ConfigMap and Secret volumes rewritten this often

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var" / "lib" / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "var" / "run" / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.kubelet_dir / "kmm-emulator"


class _Pods:
    """The reflector's sink: the node's pods by uid, and a wake-up on change."""

    def __init__(self) -> None:
        self.by_uid: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Event()
        self.synced = asyncio.Event()

    def replace(self, items: list[objects.RawObject], resource_version: str) -> None:
        self.by_uid = {str(p["metadata"]["uid"]): p for p in items}
        self.synced.set()
        self.changed.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        pod = event["object"]
        uid = str((pod.get("metadata") or {}).get("uid"))
        if event["type"] == "DELETED":
            self.by_uid.pop(uid, None)
        elif event["type"] in ("ADDED", "MODIFIED"):
            self.by_uid[uid] = pod
        self.changed.set()


class Emulator:
    def __init__(self, api: client.Client, options: Options) -> None:
        self.api = api
        self.options = options
        self.registry = registration.Registry()
        self.metrics = kubelet_metrics.Metrics()
        self.manager = dra.Manager(
            api, self.registry, checkpoint.Store(options.kubelet_dir), self.metrics
        )
        self.metrics_server: httpserving.Server | None = None
        # Pod syncs and restarts take turns: a restart swaps the state a sync reads.
        self._turn = asyncio.Lock()
        self.watcher = registration.PluginWatcher(
            options.kubelet_dir / "plugins_registry", self.registry, poll=options.poll
        )
        self.pods = _Pods()
        self._started: set[str] = set()
        # Pods whose prepare failed: when to try again. An entry goes when the
        # prepare succeeds or the pod goes (``_forget``, ``_gone``).
        self._next_try: dict[str, float] = {}
        self._wipes: dict[str, asyncio.Task[None]] = {}
        self.containers: dict[str, dict[str, list[str]]] = {}  # pod uid -> container -> CDI ids
        self._started_at: dict[str, str] = {}
        self.runs: dict[str, processes.PodRun] = {}  # pod uid -> its containers
        self._completed: set[str] = set()  # final phase written
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self.registry.add_listener(self._plugins_changed)
        self.health = health.Cache(options.kubelet_dir / health.FILE_NAME)
        self.streams = (
            health.Streams(
                self.registry, self.health, self._health_changed, retry=options.health_retry
            )
            if options.resource_health
            else None
        )
        self._refresh: set[str] = set()  # pods whose status must be written again
        self._health_event = asyncio.Event()

    # -- slices ----------------------------------------------------------

    async def wipe(self, driver: str | None = None) -> None:
        selector = f"spec.nodeName={self.options.node.name}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        try:
            await self.api.request(
                "DELETE", resources.RESOURCE_SLICES.path(), query={"fieldSelector": selector}
            )
        except errors.ApiError as err:
            _log.warning("wiping ResourceSlices (%s) failed: %s", selector, err)

    def _plugins_changed(self, driver: str) -> None:
        pending = self._wipes.pop(driver, None)
        usable = self.registry.usable(driver)
        if pending is not None:
            # Why travels with the cancellation: the wipe itself records how
            # the absence ended, so a wipe that is not cancelled cannot be
            # counted as a return.
            pending.cancel(_RETURNED if usable else None)
        if not usable:
            self._wipes[driver] = asyncio.get_running_loop().create_task(self._wipe_later(driver))
        self.pods.changed.set()  # pods waiting for this driver may proceed

    async def _wipe_later(self, driver: str) -> None:
        try:
            await asyncio.sleep(self.options.wipe_delay)
            if not self.registry.usable(driver):
                _log.info(
                    "driver %s gone for %.0f s: wiping its slices", driver, self.options.wipe_delay
                )
                await self.wipe(driver)
                self._absence_ended(driver, "wiped")
            else:
                self._absence_ended(driver, _RETURNED)
        except asyncio.CancelledError as cancelled:
            # Back in time (or during the wipe); a restart's or a stop's
            # cancellation ends no absence.
            if cancelled.args == (_RETURNED,):
                self._absence_ended(driver, _RETURNED)
            raise
        self._wipes.pop(driver, None)

    def _absence_ended(self, driver: str, outcome: str) -> None:
        self.metrics.driver_absences.labels(driver, outcome).inc()

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
        self._refresh |= self._holders(driver, keys)
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
                    self._refresh |= self._holders(driver, None)
                self.pods.changed.set()

    # -- pods ------------------------------------------------------------

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.options.node.name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(errors.ApiError):
            await self.api.request("POST", resources.EVENTS.path(meta["namespace"]), body=body)

    def _record_containers(self) -> None:
        self.options.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.options.state_dir / "containers.json"
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(self.containers, indent=2, sort_keys=True))
        staging.replace(path)

    async def _start(self, pod: dict[str, Any]) -> None:
        uid = str(pod["metadata"]["uid"])
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_try.get(uid, 0.0):
            return
        try:
            await self.manager.prepare(pod)
        except dra.PrepareError as err:
            self.metrics.pod_operations.labels("PrepareResources", "error").inc()
            self._next_try[uid] = loop.time() + self.options.retry
            loop.call_later(self.options.retry, self.pods.changed.set)
            _log.warning(
                "pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], err
            )
            await self._event(
                pod, "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {err}"
            )
            return
        self.metrics.pod_operations.labels("PrepareResources", "ok").inc()
        self._next_try.pop(uid, None)
        spec = pod.get("spec") or {}
        self.containers[uid] = {
            c["name"]: self.manager.cdi_devices(pod, c)
            for c in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
        }
        self._record_containers()
        # A kubelet restart leaves containers running: a pod already running
        # keeps its run (and its processes).
        if uid not in self.runs:
            run = self.runs[uid] = processes.PodRun(pod, self._settings(), self._run_changed(uid))
            self._started_at[uid] = _now()
            run.start()
        self._started.add(uid)
        await self._write_status(pod)

    def _settings(self) -> processes.Settings:
        return processes.Settings(
            api=self.api,
            root=self.options.root,
            state_dir=self.options.state_dir,
            server=self.api.access.server,
            process_image=self.options.process_image,
            backoff=self.options.restart_backoff,
            volume_refresh=self.options.volume_refresh,
        )

    def _run_changed(self, uid: str) -> Callable[[], None]:
        def changed() -> None:
            self._refresh.add(uid)
            self.pods.changed.set()

        return changed

    def _container_statuses(
        self, pod: Mapping[str, Any], run: processes.PodRun
    ) -> list[dict[str, Any]]:
        statuses = run.statuses()
        if not self.options.resource_health:
            return statuses
        specs = {c["name"]: c for c in (pod.get("spec") or {}).get("containers") or ()}
        for status in statuses:
            allocated = health.resource_statuses(
                specs[status["name"]],
                lambda name: self._prepared_devices(pod, name),
                self.health.get,
            )
            if allocated:
                status["allocatedResourcesStatus"] = allocated
        return statuses

    def _prepared_devices(
        self, pod: Mapping[str, Any], pod_claim: str
    ) -> Mapping[str, list[checkpoint.Device]] | None:
        """A pod claim's devices by driver, found as the 1.35 kubelet finds them
        for health: only through ``pod.status.resourceClaimStatuses``, so a
        claim named directly in the pod spec gets no health entry there."""
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("name") == pod_claim and status.get("resourceClaimName"):
                info = self.manager.claims.get(
                    (pod["metadata"]["namespace"], status["resourceClaimName"])
                )
                return None if info is None else info.drivers
        return None

    async def _write_status(self, pod: Mapping[str, Any], phase: str | None = None) -> bool:
        """The pod's status from its run; False when the pod is gone."""
        uid = str(pod["metadata"]["uid"])
        run = self.runs.get(uid)
        if run is None:
            return False
        started = self._started_at[uid]
        conditions = [
            {"type": kind, "status": str(value), "lastTransitionTime": started}
            for kind, value in (
                ("PodReadyToStartContainers", True),
                ("Initialized", run.initialized),
                ("Ready", run.ready),
                ("ContainersReady", run.ready),
            )
        ]
        status: dict[str, Any] = {
            "phase": phase or run.phase,
            "conditions": conditions,
            "containerStatuses": self._container_statuses(pod, run),
            "hostIP": self.options.node.address,
            "hostIPs": [{"ip": self.options.node.address}],
            "podIP": self.options.node.address,
            "podIPs": [{"ip": self.options.node.address}],
            "startTime": started,
        }
        if run.init_containers:
            status["initContainerStatuses"] = run.statuses(init=True)
        try:
            await self.api.request(
                "PATCH",
                resources.PODS.path(
                    pod["metadata"]["namespace"], pod["metadata"]["name"], subresource="status"
                ),
                body={"status": status},
                content_type=client.MERGE_PATCH,
            )
        except errors.NotFound:
            return False
        return True

    async def _unprepare(self, uid: str, what: str) -> bool:
        """The pod's claims unprepared (from the cache); False: retried later."""
        try:
            await self.manager.unprepare(uid)
        except dra.PrepareError as err:
            self.metrics.pod_operations.labels("UnprepareResources", "error").inc()
            _log.warning("pod %s: %s; retrying", what, err)
            asyncio.get_running_loop().call_later(self.options.retry, self.pods.changed.set)
            return False
        self.metrics.pod_operations.labels("UnprepareResources", "ok").inc()
        return True

    async def _complete(self, pod: Mapping[str, Any], run: processes.PodRun) -> None:
        """Every container done for good: claims unprepared, then the final
        phase written, in the kubelet's order (SyncTerminatingPod)."""
        uid = str(pod["metadata"]["uid"])
        if not await self._unprepare(uid, str(pod["metadata"]["name"])):
            return
        if await self._write_status(pod):
            self._completed.add(uid)

    def _grace(self, pod: Mapping[str, Any]) -> float:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        seconds = meta.get("deletionGracePeriodSeconds")
        if seconds is None:
            seconds = spec.get("terminationGracePeriodSeconds", 30)
        return float(seconds)

    async def _finish(self, pod: Mapping[str, Any]) -> None:
        """A pod being deleted: its containers stopped within the grace period,
        then its claims unprepared, then the pod deleted for good."""
        uid = str(pod["metadata"]["uid"])
        run = self.runs.get(uid)
        if run is not None and not run.stopped:
            if uid not in self._stopping:
                self._stopping[uid] = asyncio.ensure_future(run.stop(self._grace(pod)))
                self._stopping[uid].add_done_callback(lambda _: self.pods.changed.set())
            return
        if not await self._unprepare(uid, str(pod["metadata"]["name"])):
            return
        self._forget(uid)
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.api.request(
                "DELETE",
                resources.PODS.path(pod["metadata"]["namespace"], pod["metadata"]["name"]),
                # In the body: the server reads the body's options over the query's.
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid},
                },
            )

    def _forget(self, uid: str) -> None:
        self._started.discard(uid)
        self._next_try.pop(uid, None)
        self._completed.discard(uid)
        self._started_at.pop(uid, None)
        self._stopping.pop(uid, None)
        self.runs.pop(uid, None)
        if self.containers.pop(uid, None) is not None:
            self._record_containers()

    async def _gone(self) -> None:
        """Pods that vanished (force-deleted): their processes killed, their
        claims unprepared from the cache, their retry forgotten."""
        present = set(self.pods.by_uid)
        for uid in set(self._next_try) - present:
            # A pod whose prepare failed may hold no claim and no run: nothing
            # below would name it.
            del self._next_try[uid]
        known = {uid for info in self.manager.claims.values() for uid in info.pod_uids}
        for uid in sorted((known | set(self.runs)) - present):
            run = self.runs.get(uid)
            if run is not None and not run.stopped:
                await run.stop(0)
            if await self._unprepare(uid, f"{uid} (gone)"):
                self._forget(uid)

    async def sync_pods(self) -> None:
        starting = []
        refresh, self._refresh = self._refresh, set()
        for pod in list(self.pods.by_uid.values()):
            uid = str(pod["metadata"]["uid"])
            run = self.runs.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                await self._finish(pod)
            elif uid in self._completed:
                continue
            elif run is not None and run.done.is_set() and uid in self._started:
                await self._complete(pod, run)
            elif uid in self._started and uid in refresh:
                await self._write_status(pod)
            elif uid not in self._started and (pod.get("status") or {}).get("phase") in (
                None,
                "Pending",
                "Running",
            ):
                starting.append(self._start(pod))
        # Side by side, as the kubelet's pod workers start pods.
        await asyncio.gather(*starting)
        await self._gone()

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

        As in 1.35, a running pod is not prepared again (the kubelet prepares
        only when it creates a pod's sandbox, and the sandboxes survive); a
        claim is sent again when a new pod uses it, so drivers must answer a
        second prepare of a claim they hold. ``reprepare`` is the stricter
        test: every running pod's claims are prepared again at once.
        ``reboot`` kills every container and empties the CDI directory (a
        tmpfs on real nodes) first: every pod starts again, its claims
        prepared again, and the drivers must rebuild their CDI specs."""
        async with self._turn:
            _log.info("emulating a kubelet %s", "reboot" if reboot else "restart")
            for pending in self._wipes.values():
                pending.cancel()
            self._wipes.clear()
            if self.streams is not None:
                await self.streams.close()
            await self.registry.close()
            self.watcher.forget()
            if reboot:
                await asyncio.gather(*(run.stop(0) for run in self.runs.values()))
                self.runs.clear()
                self._started_at.clear()
                self._completed.clear()
                cdi = self.options.cdi_dir
                for entry in cdi.glob("*") if cdi.is_dir() else ():
                    entry.unlink(missing_ok=True)
            await self.wipe()
            self.manager.load()
            if reboot or reprepare:
                self._started.clear()
            self._next_try.clear()
        self.pods.changed.set()

    # -- the whole -------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        for path in (
            self.options.kubelet_dir / "plugins_registry",
            self.options.kubelet_dir / "plugins",
        ):
            path.mkdir(parents=True, exist_ok=True)
        node = await nodes.register(self.api, self.options.node)
        await self.wipe()
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
                nodes.Heartbeat(self.api, self.options.node, node["metadata"]["uid"]).run(),
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
            ending = [*running, *self._wipes.values()]
            for task in ending:
                task.cancel()
            _, stuck = await asyncio.wait(ending, timeout=10)
            for task in stuck:
                _log.error("task %s did not end when cancelled", task.get_name())
            # No runtime keeps these processes once the emulator is gone.
            await asyncio.gather(*(run.stop(0) for run in self.runs.values() if not run.stopped))
            if self.streams is not None:
                await self.streams.close()
            await self.registry.close()
            # Stopping the processes above may have dropped plugins: their
            # delayed wipes end with the emulator too.
            wipes = list(self._wipes.values())
            for task in wipes:
                task.cancel()
            await asyncio.gather(*wipes, return_exceptions=True)
