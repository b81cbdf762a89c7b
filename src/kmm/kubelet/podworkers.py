"""The pods bound to the node, each taken through its life as the kubelet does.

``PodSink`` is the pod reflector's sink: the node's pods by uid and a
wake-up on change. ``PodWorkers.sync`` looks at every pod and:

- a pod to start: its claims prepared (``dra.Manager``); on failure a Warning
  Event ``FailedPrepareDynamicResources`` ("Failed to prepare dynamic
  resources: ...") and a retry after ``retry`` seconds, the pod staying
  Pending; on success each container's CDI device ids recorded (there is no
  runtime: ``containers.json`` under the emulator's state dir says what a
  runtime would have been given) and its containers started, the status
  following them (``podstatuses``);
- a pod whose containers are all done for good: its claims unprepared, then
  its final phase written (the kubelet's SyncTerminatingPod order);
- a pod being deleted: its containers stopped (SIGTERM, SIGKILL after the
  grace period), then its claims unprepared (retried until the driver
  answers), and only then is the pod deleted for good, as the kubelet does;
- a pod gone without that (force-deleted): its processes killed and its
  claims unprepared from the cache all the same.

Containers run as ``processes`` says. The loop that calls ``sync``, and the
restarts that reset the workers between syncs, are the emulator's
(``emulator``).
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

from kmm.kube import client, errors, listwatch, objects, resources
from kmm.kubelet import dra, metrics, podstatuses, processes

__all__ = ["PodSink", "PodWorkers", "Settings"]

_log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodSink:
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


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the workers need of the emulator's options."""

    node: str
    retry: float  # between prepare attempts of a failing pod
    state_dir: Path  # where containers.json is written
    run_settings: processes.Settings  # every pod run's


class PodWorkers:
    """Every pod of the node, started, completed, finished or forgotten."""

    def __init__(
        self,
        api: client.Client,
        settings: Settings,
        *,
        pods: PodSink,
        manager: dra.Manager,
        statuses: podstatuses.StatusWriter,
        counts: metrics.Metrics,
    ) -> None:
        self._api = api
        self._settings = settings
        self._pods = pods
        self._manager = manager
        self._statuses = statuses
        self._metrics = counts
        self._started: set[str] = set()
        # Pods whose prepare failed: when to try again. An entry goes when the
        # prepare succeeds or the pod goes (``_forget``, ``_gone``).
        self.next_try: dict[str, float] = {}
        self.containers: dict[str, dict[str, list[str]]] = {}  # pod uid -> container -> CDI ids
        self._started_at: dict[str, str] = {}
        self.runs: dict[str, processes.PodRun] = {}  # pod uid -> its containers
        self._completed: set[str] = set()  # final phase written
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._refresh: set[str] = set()  # pods whose status must be written again

    def refresh(self, uids: set[str]) -> None:
        """Write these pods' status again at the next sync."""
        self._refresh |= uids

    async def sync(self) -> None:
        starting = []
        refresh, self._refresh = self._refresh, set()
        for pod in list(self._pods.by_uid.values()):
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

    async def kill(self) -> None:
        """A reboot: every container killed, every pod to be started afresh."""
        await asyncio.gather(*(run.stop(0) for run in self.runs.values()))
        self.runs.clear()
        self._started_at.clear()
        self._completed.clear()

    def restarted(self, *, start_again: bool) -> None:
        """A kubelet restart: retries forgotten; with ``start_again`` every
        pod is started (its claims prepared) again."""
        if start_again:
            self._started.clear()
        self.next_try.clear()

    async def stop(self) -> None:
        """Every container stopped: no runtime keeps them once the emulator is gone."""
        await asyncio.gather(*(run.stop(0) for run in self.runs.values() if not run.stopped))

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
            "source": {"component": "kubelet", "host": self._settings.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(errors.ApiError):
            await self._api.request("POST", resources.EVENTS.path(meta["namespace"]), body=body)

    def _record_containers(self) -> None:
        self._settings.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._settings.state_dir / "containers.json"
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(self.containers, indent=2, sort_keys=True))
        staging.replace(path)

    async def _start(self, pod: dict[str, Any]) -> None:
        uid = str(pod["metadata"]["uid"])
        loop = asyncio.get_running_loop()
        if loop.time() < self.next_try.get(uid, 0.0):
            return
        try:
            await self._manager.prepare(pod)
        except dra.PrepareError as err:
            self._metrics.pod_operations.labels("PrepareResources", "error").inc()
            self.next_try[uid] = loop.time() + self._settings.retry
            loop.call_later(self._settings.retry, self._pods.changed.set)
            _log.warning(
                "pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], err
            )
            await self._event(
                pod, "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {err}"
            )
            return
        self._metrics.pod_operations.labels("PrepareResources", "ok").inc()
        self.next_try.pop(uid, None)
        spec = pod.get("spec") or {}
        self.containers[uid] = {
            c["name"]: self._manager.cdi_devices(pod, c)
            for c in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
        }
        self._record_containers()
        # A kubelet restart leaves containers running: a pod already running
        # keeps its run (and its processes).
        if uid not in self.runs:
            run = self.runs[uid] = processes.PodRun(
                pod, self._settings.run_settings, self._run_changed(uid)
            )
            self._started_at[uid] = _now()
            run.start()
        self._started.add(uid)
        await self._write_status(pod)

    def _run_changed(self, uid: str) -> Callable[[], None]:
        def changed() -> None:
            self._refresh.add(uid)
            self._pods.changed.set()

        return changed

    async def _write_status(self, pod: Mapping[str, Any], phase: str | None = None) -> bool:
        """The pod's status from its run; False when the pod is gone."""
        uid = str(pod["metadata"]["uid"])
        run = self.runs.get(uid)
        if run is None:
            return False
        return await self._statuses.write(pod, run, started=self._started_at[uid], phase=phase)

    async def _unprepare(self, uid: str, what: str) -> bool:
        """The pod's claims unprepared (from the cache); False: retried later."""
        try:
            await self._manager.unprepare(uid)
        except dra.PrepareError as err:
            self._metrics.pod_operations.labels("UnprepareResources", "error").inc()
            _log.warning("pod %s: %s; retrying", what, err)
            asyncio.get_running_loop().call_later(self._settings.retry, self._pods.changed.set)
            return False
        self._metrics.pod_operations.labels("UnprepareResources", "ok").inc()
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
                self._stopping[uid].add_done_callback(lambda _: self._pods.changed.set())
            return
        if not await self._unprepare(uid, str(pod["metadata"]["name"])):
            return
        self._forget(uid)
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self._api.request(
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
        self.next_try.pop(uid, None)
        self._completed.discard(uid)
        self._started_at.pop(uid, None)
        self._stopping.pop(uid, None)
        self.runs.pop(uid, None)
        if self.containers.pop(uid, None) is not None:
            self._record_containers()

    async def _gone(self) -> None:
        """Pods that vanished (force-deleted): their processes killed, their
        claims unprepared from the cache, their retry forgotten."""
        present = set(self._pods.by_uid)
        for uid in set(self.next_try) - present:
            # A pod whose prepare failed may hold no claim and no run: nothing
            # below would name it.
            del self.next_try[uid]
        known = {uid for info in self._manager.claims.values() for uid in info.pod_uids}
        for uid in sorted((known | set(self.runs)) - present):
            run = self.runs.get(uid)
            if run is not None and not run.stopped:
                await run.stop(0)
            if await self._unprepare(uid, f"{uid} (gone)"):
                self._forget(uid)
