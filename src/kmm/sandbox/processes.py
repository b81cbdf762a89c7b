"""Start component processes detached from us, and stop exactly those.

A component runs in a session of its own (so it outlives ``kmm sandbox up``
and a stop signal reaches its whole group) with its output in a log file. A
record keeps the pid *and* the kernel's start time of that pid: a pid can be
reused after the process dies, and ``down`` must never signal a stranger.

Waiting for a stopped process sleeps on a pidfd (readable once the process
has exited) rather than polling: ``stop`` and ``kill`` block in poll(2), for
the CLI; ``stop_async`` and ``kill_async`` await it on the running loop, for
tests that stop a component while their own coroutines keep running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import select
import signal
from pathlib import Path

__all__ = ["Process", "launch", "log_tail"]


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after it start past ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclasses.dataclass(frozen=True)
class Process:
    """One launched component."""

    name: str
    pid: int
    start_ticks: int
    log: Path
    argv: tuple[str, ...]
    health_url: str = ""

    def alive(self) -> bool:
        self._reap()
        return _start_ticks(self.pid) == self.start_ticks

    def _reap(self) -> None:
        # When the caller is the parent (tests), a dead child stays a zombie
        # until waited for; elsewhere this is a no-op.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)

    def rss_bytes(self) -> int:
        """Resident memory, or 0 when the process is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _handle(self) -> int | None:
        """A pidfd of this very process, or None when it is gone.

        Opened before the start time is checked again: if the ticks still
        match then, the descriptor holds our process and not a later one that
        reused the pid, and it stays ours however long we wait on it.
        """
        try:
            handle = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return None
        if not self.alive():
            os.close(handle)
            return None
        return handle

    def _signal_group(self, signum: signal.Signals) -> None:
        # Called with a pidfd of the leader held, so the pid (the group's id)
        # still names our group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def stop(self, *, grace_seconds: float = 10.0) -> None:
        """SIGTERM the component's process group, SIGKILL it after the grace.

        Blocks the calling thread (the CLI's way); on an event loop use
        ``stop_async``, which lets the loop run meanwhile.
        """
        handle = self._handle()
        if handle is None:
            return
        try:
            self._signal_group(signal.SIGTERM)
            if not _wait_exit(handle, grace_seconds):
                self._signal_group(signal.SIGKILL)
                _wait_exit(handle, None)
        finally:
            os.close(handle)
            self._reap()

    def kill(self) -> None:
        """SIGKILL the component's process group and wait for it to die (a
        crash: no shutdown). Waits without spinning; SIGKILL is brief, so a
        hook on an event loop may call it."""
        handle = self._handle()
        if handle is None:
            return
        try:
            self._signal_group(signal.SIGKILL)
            _wait_exit(handle, None)
        finally:
            os.close(handle)
            self._reap()

    async def stop_async(self, *, grace_seconds: float = 10.0) -> None:
        """``stop`` for a caller on an event loop: the loop runs while the
        component shuts down (an operator under test on the same loop is
        not frozen by its API server going away)."""
        handle = self._handle()
        if handle is None:
            return
        try:
            self._signal_group(signal.SIGTERM)
            if not await _await_exit(handle, grace_seconds):
                self._signal_group(signal.SIGKILL)
                await _await_exit(handle, None)
        finally:
            os.close(handle)
            self._reap()

    async def kill_async(self) -> None:
        """``kill`` for a caller on an event loop."""
        handle = self._handle()
        if handle is None:
            return
        try:
            self._signal_group(signal.SIGKILL)
            await _await_exit(handle, None)
        finally:
            os.close(handle)
            self._reap()


def _wait_exit(handle: int, timeout: float | None) -> bool:
    """Block until the process behind pidfd ``handle`` exits; False on timeout.

    A pidfd turns readable when its process exits (a zombie counts), so this
    sleeps in poll(2) instead of polling /proc.
    """
    poller = select.poll()
    poller.register(handle, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


async def _await_exit(handle: int, timeout: float | None) -> bool:
    """``_wait_exit`` on the running loop: a reader on the pidfd, no thread."""
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(handle, readable)
    try:
        await asyncio.wait_for(exited, timeout)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(handle)
    return True


def launch(
    name: str,
    argv: list[str],
    *,
    log: Path,
    health_url: str = "",
    env: dict[str, str] | None = None,
) -> Process:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log``.

    posix_spawn rather than subprocess.Popen: the child must outlive any Popen
    object, which would otherwise warn when collected while its child runs.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    pid = os.posix_spawn(
        argv[0],
        argv,
        env if env is not None else dict(os.environ),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    ticks = _start_ticks(pid)
    if ticks is None:
        # It died before we could look at it; record a value that never matches.
        ticks = -1
    return Process(
        name=name, pid=pid, start_ticks=ticks, log=log, argv=tuple(argv), health_url=health_url
    )


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])
