"""The containers of one pod on an emulated node, and the pod's phase from them.

There is no container runtime. A container whose image is the one the
emulator runs (kmm's own image by default) runs as a local process, given
what ``podenv`` translates (argv, environment, mapped paths, service
account); every other container is "running" without a process, forever,
as a container that never exits would be.

``PodRun.run`` follows the kubelet's order: init containers one at a time,
each to a successful exit (a failure restarts it, or fails the pod when
``restartPolicy`` is ``Never``); then every container at once. A container
process that exits is restarted per ``restartPolicy`` (``Always``; on a
non-zero code for ``OnFailure``; never for ``Never``) after a back-off
that doubles from ``backoff`` up to five minutes (the kubelet's
CrashLoopBackOff), its last termination kept as ``lastState``. Probes:
``startupProbe`` gates the others; a failing ``livenessProbe`` kills the
process, which then restarts per policy; ``readinessProbe`` sets
``ready``; with no readiness probe a process is ready while it runs. The
phase is ``Pending`` until the containers start, ``Running`` while any runs
or will restart, then ``Succeeded`` when every container exited 0, else
``Failed``.

``stop(grace)`` is the kubelet's kill: SIGTERM to each process group, SIGKILL
to what is left after ``grace`` seconds; nothing restarts after it.

Output goes to ``<root>/var/log/pods/<namespace>_<name>_<uid>/<container>/<restart>.log``
as the kubelet lays logs out (raw bytes, not the CRI log format). A bound
service account token is requested again at 80% of its lifetime, as the
kubelet refreshes projected tokens. Lifecycle hooks are not run (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from kmm.kube import client
from kmm.kubelet import podenv, probes

__all__ = ["MAX_BACKOFF", "Container", "PodRun", "Settings"]

_log = logging.getLogger(__name__)

MAX_BACKOFF: Final = 300.0  # the kubelet's MaxContainerBackOff


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every pod run of one emulator shares."""

    api: client.Client
    root: Path
    state_dir: Path
    server: str  # the API server's URL, as the processes reach it
    process_image: str | None
    backoff: float = 10.0  # the kubelet's initial CrashLoopBackOff
    volume_refresh: float = 60.0  # how often ConfigMap and Secret volumes are rewritten


@dataclasses.dataclass
class Container:
    spec: Mapping[str, Any]
    init: bool
    runs_process: bool
    process: asyncio.subprocess.Process | None = None
    restart_count: int = 0
    started_at: str | None = None
    running: bool = False
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    waiting: dict[str, str] | None = None
    ready: bool = False
    started: bool = False  # the startup probe passed (or there is none)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, uid: str) -> dict[str, Any]:
        image = str(self.spec.get("image", ""))
        if self.running:
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            state = {"waiting": self.waiting or {"reason": "ContainerCreating"}}
        status: dict[str, Any] = {
            "name": self.name,
            "image": image,
            "imageID": image,
            "containerID": f"kmm-emulator://{uid}-{self.name}",
            "ready": self.ready,
            "started": self.running and self.started,
            "restartCount": self.restart_count,
            "state": state,
        }
        if self.last_terminated is not None:
            status["lastState"] = {"terminated": self.last_terminated}
        return status


class PodRun:
    """One pod's containers, from start to the end or ``stop``."""

    def __init__(
        self, pod: Mapping[str, Any], settings: Settings, changed: Callable[[], None]
    ) -> None:
        self.pod = pod
        self.settings = settings
        self.changed = changed
        spec = pod.get("spec") or {}
        self.policy = str(spec.get("restartPolicy") or "Always")
        image = settings.process_image

        def container(c: Mapping[str, Any], init: bool) -> Container:
            return Container(c, init, runs_process=image is not None and c.get("image") == image)

        self.init_containers = [container(c, True) for c in spec.get("initContainers") or ()]
        self.containers = [container(c, False) for c in spec.get("containers") or ()]
        self.done = asyncio.Event()
        self.stopped = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._helpers: set[asyncio.Task[None]] = set()
        meta = pod["metadata"]
        self.uid = str(meta["uid"])
        self.log_dir = (
            settings.root / "var/log/pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        )
        self.account_dir = settings.state_dir / "pods" / self.uid / "serviceaccount"
        self.volume_dir = settings.state_dir / "pods" / self.uid / "volumes"
        for c in (*self.init_containers, *self.containers):
            if c.runs_process and (c.spec.get("lifecycle") or {}):
                _log.warning(
                    "pod %s/%s container %s: lifecycle hooks are not run by kmm kubelet",
                    meta["namespace"],
                    meta["name"],
                    c.name,
                )

    # -- what the pod's status says ----------------------------------------

    @property
    def phase(self) -> str:
        if self.done.is_set():
            codes = [c.terminated["exitCode"] if c.terminated else 1 for c in self.containers]
            return "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
        if self.containers and all(c.started_at is not None for c in self.containers):
            return "Running"
        return "Pending"

    @property
    def initialized(self) -> bool:
        return all(c.terminated and c.terminated["exitCode"] == 0 for c in self.init_containers)

    @property
    def ready(self) -> bool:
        return bool(self.containers) and all(c.ready for c in self.containers)

    def statuses(self, init: bool = False) -> list[dict[str, Any]]:
        return [c.status(self.uid) for c in (self.init_containers if init else self.containers)]

    # -- running -------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self.run())
        if any(c.runs_process for c in (*self.init_containers, *self.containers)):
            refreshing = asyncio.ensure_future(self._refresh_volumes())
            self._helpers.add(refreshing)

    async def _refresh_volumes(self) -> None:
        """ConfigMap and Secret volumes follow their sources, as the kubelet's sync does."""
        while True:
            await asyncio.sleep(self.settings.volume_refresh)
            try:
                await podenv.project_volumes(self.settings.api, self.pod, self.volume_dir)
            except Exception as err:  # any failure: the files stay as they were; retried
                _log.warning("pod %s: volumes not refreshed: %s", self.uid, err)

    async def run(self) -> None:
        try:
            for c in self.init_containers:
                if not await self._supervise(c):
                    return
            await asyncio.gather(*(self._supervise(c) for c in self.containers))
        finally:
            for task in self._helpers:
                task.cancel()
            self.done.set()
            self.changed()

    async def _supervise(self, c: Container) -> bool:
        """Run one container until it is done for good; whether it ended well."""
        delay = self.settings.backoff
        while not self._stopping:
            if not c.runs_process:
                c.running, c.started, c.started_at = True, True, _now()
                if c.init:
                    c.running, c.ready = False, False
                    c.terminated = _terminated(0, c.started_at)
                    self.changed()
                    return True
                c.ready = True
                self.changed()
                await asyncio.Event().wait()  # runs until stopped (cancelled)
            code = await self._run_once(c)
            if code is None:  # not started (its configuration is missing): tried again
                continue
            ok = code == 0
            if c.init and ok:
                return True
            if self._stopping or self.policy == "Never" or (self.policy == "OnFailure" and ok):
                return ok
            c.waiting = {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.0f}s restarting failed container={c.name} "
                f"pod={self.pod['metadata']['name']}_{self.pod['metadata']['namespace']}"
                f"({self.uid})",
            }
            self.changed()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)
            c.last_terminated, c.terminated = c.terminated, None
            c.restart_count += 1
        return False

    async def _run_once(self, c: Container) -> int | None:
        """Start the container's process and wait for it; its exit code, or None
        when it could not be configured (the kubelet keeps such a container
        waiting in CreateContainerConfigError and tries again)."""
        try:
            launch, lifetime = await podenv.build(
                self.settings.api,
                self.pod,
                c.spec,
                root=self.settings.root,
                server=self.settings.server,
                account_dir=self.account_dir,
                base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root"},
                volume_dir=self.volume_dir,
            )
        except podenv.ConfigError as err:
            c.waiting = {"reason": "CreateContainerConfigError", "message": str(err)}
            self.changed()
            await asyncio.sleep(self.settings.backoff)
            return None
        if self._stopping:
            return None
        log = self.log_dir / c.name / f"{c.restart_count}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log.open("ab") as out:
                c.process = await asyncio.create_subprocess_exec(
                    *launch.argv,
                    env=launch.env,
                    cwd=launch.cwd,
                    stdout=out,
                    stderr=out,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # its own group: stop() signals every child
                )
        except OSError as err:  # the runtime's StartError: it counts as an exit
            c.terminated = {**_terminated(128, _now()), "reason": "StartError", "message": str(err)}
            self.changed()
            return 128
        started = c.started_at = _now()
        c.running, c.waiting = True, None
        probing = self._probes(c)
        if lifetime is not None:
            probing.append(asyncio.ensure_future(self._refresh_token(lifetime)))
        self.changed()
        try:
            code = await c.process.wait()
        except asyncio.CancelledError:
            # Cancelled by stop(): nothing of this container may outlive it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.process.pid, signal.SIGKILL)
            raise
        finally:
            for task in probing:
                task.cancel()
        # A signal's death reads as 128 + the signal, as runtimes report it.
        code = 128 - code if code < 0 else code
        c.running, c.ready, c.started = False, False, False
        c.terminated = _terminated(code, started)
        self.changed()
        return code

    def _probes(self, c: Container) -> list[asyncio.Task[None]]:
        spec, running = c.spec, []

        async def run_exec(argv: list[str], timeout: float) -> bool:
            launch, _ = await podenv.build(
                self.settings.api,
                self.pod,
                {**spec, "command": argv, "args": []},
                root=self.settings.root,
                server=self.settings.server,
                account_dir=self.account_dir,
                base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
            process = await asyncio.create_subprocess_exec(
                *launch.argv, env=launch.env, stdout=asyncio.subprocess.DEVNULL
            )
            try:
                return await asyncio.wait_for(process.wait(), timeout) == 0
            except TimeoutError:
                process.kill()
                return False

        def readiness(ok: bool) -> None:
            c.ready = ok and c.started
            self.changed()

        def liveness(ok: bool) -> None:
            if not ok and c.process is not None and c.process.returncode is None:
                _log.info("container %s failed its liveness probe: killed", c.name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.process.pid, signal.SIGKILL)

        def start_probes() -> None:
            c.started = True
            if spec.get("readinessProbe"):
                ready = probes.Prober(
                    spec["readinessProbe"], spec, run_exec, readiness, initial=False
                )
                running.append(asyncio.ensure_future(ready.run()))
            else:
                c.ready = True
            if spec.get("livenessProbe"):
                alive = probes.Prober(spec["livenessProbe"], spec, run_exec, liveness, initial=True)
                running.append(asyncio.ensure_future(alive.run()))
            self.changed()

        if c.init:
            return running
        if spec.get("startupProbe"):

            def startup(ok: bool) -> None:
                if ok and not c.started:
                    start_probes()

            gate = probes.Prober(spec["startupProbe"], spec, run_exec, startup, initial=False)
            running.append(asyncio.ensure_future(gate.run()))
        else:
            start_probes()
        return running

    async def _refresh_token(self, lifetime: float) -> None:
        while True:
            await asyncio.sleep(lifetime * 0.8)
            try:
                lifetime = await podenv.write_service_account(
                    self.settings.api, self.pod, self.account_dir
                )
            except Exception as err:  # a failed refresh is retried; the old token still works
                _log.warning("pod %s: token refresh failed: %s", self.uid, err)
                lifetime = 60.0 / 0.8

    async def stop(self, grace: float) -> None:
        """SIGTERM now, SIGKILL after ``grace`` seconds; returns when all have stopped."""
        self._stopping = True
        alive = [
            c.process
            for c in (*self.init_containers, *self.containers)
            if c.process is not None and c.process.returncode is None
        ]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in alive)), timeout=grace)
        except TimeoutError:
            for process in alive:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in alive))
        for c in (*self.init_containers, *self.containers):
            if c.running and not c.runs_process:
                c.running, c.ready = False, False
                c.terminated = _terminated(0, c.started_at or _now())
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.stopped = True


def _terminated(code: int, started: str) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started,
        "finishedAt": _now(),
    }
