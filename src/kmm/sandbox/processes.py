"""Start component processes detached from us, and stop exactly those.

A component runs in a session of its own (so it outlives ``kmm sandbox up``
and a stop signal reaches its whole group) with its output in a log file. A
record keeps the pid *and* the kernel's start time of that pid: a pid can be
reused after the process dies, and ``down`` must never signal a stranger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
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

    def stop(self, *, grace_seconds: float = 10.0) -> None:
        """SIGTERM the component's process group, SIGKILL it after the grace."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline:
            if not self.alive():
                return
            time.sleep(0.05)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            while self.alive():
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the component's process group at once (a crash: no shutdown)."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        while self.alive():
            time.sleep(0.01)


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
