"""Test support for the sandbox's namespaces: a launcher that stops what it
started, and snapshots of what the host's network namespace holds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kmm.sandbox import processes


class Launcher:
    """The sandbox launcher's seam, keeping what it launched to stop it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.launched: list[processes.Process] = []

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=self.directory / f"{name.replace('/', '-')}.log", health_url=health_url
        )
        self.launched.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.launched):
            process.stop(grace_seconds=5)


def host_network() -> tuple[str, str, str]:
    """The host namespace's addresses, links and routes (every table)."""

    def ip(*argv: str) -> str:
        return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout

    return ip("-o", "addr"), ip("-o", "link"), ip("-o", "route", "show", "table", "all")


def namespace_ids(kind: str) -> set[str]:
    """Every namespace of ``kind`` (``net``, ``mnt``) some process is in."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.add(os.readlink(entry / "ns" / kind))
            except OSError:
                continue
    return found


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its (new) parent to reap it."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status[status.rindex(")") + 2] != "Z"
