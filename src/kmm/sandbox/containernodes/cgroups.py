"""What container nodes leave on the host outside their namespaces: cgroups and shims.

Containers' cgroups live under ``/<parent>/<node>`` in every hierarchy
(``create_cgroups`` makes a node's, ``remove_cgroups`` empties and removes
the parent's); containerd's shims run in sessions of their own, outside the
sandbox's record, and ``kill_shims`` finds them by their containerd's
address.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cgroup_hierarchies", "create_cgroups", "kill_shims", "remove_cgroups"]


# --- cgroups and shims -----------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (each v1 controller's and the unified one)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            found.append(Path(fields[1]))
    return found


def create_cgroups(cgroup_root: str) -> None:
    """Make ``cgroup_root`` in every hierarchy (the kubelet requires it to
    exist); a new cpuset gets its parent's cpus and mems, without which no
    task may join it."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy
        for part in Path(cgroup_root).parts[1:]:
            parent, path = path, path / part
            if path.is_dir():
                continue
            path.mkdir()
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((parent / name).read_text())


def _walk_bottom_up(path: Path) -> Iterator[Path]:
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir():
                yield from _walk_bottom_up(child)
    yield path


def _kill_procs(cgroup: Path) -> int:
    killed = 0
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
    return killed


def remove_cgroups(parent: str, *, timeout: float = 10.0) -> list[Path]:
    """SIGKILL every process under ``parent`` and remove its cgroups in every
    hierarchy; the ones that would not go within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / parent.lstrip("/")
        if not top.is_dir():
            continue
        while True:
            remaining = []
            for cgroup in _walk_bottom_up(top):
                _kill_procs(cgroup)
                try:
                    cgroup.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    remaining.append(cgroup)
            if not remaining:
                break
            if time.monotonic() > deadline:
                left += remaining
                break
            time.sleep(0.05)
    return left


def kill_shims(address: Path, *, timeout: float = 10.0) -> list[int]:
    """SIGKILL the containerd shims started for containerd at ``address``
    (they leave its session and outlive it) and wait, up to ``timeout``
    seconds, until each has exited; their pids.

    The wait is what lets ``down`` promise that no shim outlives it: a
    SIGKILLed process still runs until the kernel has torn it down, which on
    a loaded machine is long enough to be seen."""
    killed: list[int] = []
    exits: list[int] = []  # pidfds: readable once the process has exited
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"containerd-shim-runc-v2"):
            continue
        flag = argv.index(b"-address") if b"-address" in argv else -1
        if 0 <= flag < len(argv) - 1 and argv[flag + 1] == str(address).encode():
            try:
                # Opened first, so the signal reaches this process and not a
                # later one given the same pid.
                pidfd = os.pidfd_open(int(entry.name))
            except ProcessLookupError:
                continue
            exits.append(pidfd)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(int(entry.name))
    deadline = time.monotonic() + timeout
    try:
        for pidfd in exits:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for pidfd in exits:
            os.close(pidfd)
    return killed
