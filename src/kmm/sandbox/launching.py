"""Launch a sandbox's processes and keep its record on disk current.

Every process a sandbox starts goes through ``Launcher.launch``, which writes
it into the record (``state``) the moment it exists, so ``down`` can stop a
start that was interrupted half-way. ``relaunch`` starts a recorded process
again from its command line, port and log (which continues): what
``restarting`` and the node kinds' ``restart`` do.
"""

from __future__ import annotations

from collections.abc import Callable

from kmm.kube import kubeconfigs as kube_access
from kmm.sandbox import errors, health, processes, state

__all__ = ["Launcher", "find", "relaunch", "stop"]


class Launcher:
    """Launches components and keeps the record on disk current."""

    def __init__(self, record: state.SandboxState) -> None:
        self.record = record

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=self.record.directory / "logs" / f"{name}.log", health_url=health_url
        )
        self.record.launched.append(process)
        state.save(self.record)
        return process


def find(record: state.SandboxState, name: str) -> int:
    """The index of process ``name`` in the record; NotRunning naming the
    sandbox's processes when it has none of that name."""
    for index, process in enumerate(record.launched):
        if process.name == name:
            return index
    names = ", ".join(p.name for p in record.launched)
    raise errors.NotRunning(f"the sandbox in {record.directory} has no {name}; it has {names}")


async def relaunch(
    record: state.SandboxState,
    index: int,
    *,
    timeout: float,
    access: kube_access.Access | None = None,
) -> processes.Process:
    """Start the stopped process ``record.launched[index]`` again as it was
    launched, record it, and return once healthy (at once for a process
    with no health endpoint). SandboxInUse when it is running: a second copy
    would fight the first for its port and data."""
    process = record.launched[index]
    if process.alive():
        raise errors.SandboxInUse(
            f"{process.name} is already running (pid {process.pid}); "
            f"stop it first, or use `kmm sandbox restart {process.name}`"
        )
    again = processes.launch(
        process.name, list(process.argv), log=process.log, health_url=process.health_url
    )
    record.launched[index] = again
    state.save(record)
    if again.health_url:
        await health.wait_healthy(again, timeout=timeout, access=access)
    return again


def stop(record: state.SandboxState, wanted: Callable[[str], bool]) -> list[processes.Process]:
    """Stop the recorded processes whose names are ``wanted``, the last
    launched first; those that were still running."""
    running = []
    for process in reversed(record.launched):
        if wanted(process.name):
            if process.alive():
                running.append(process)
            process.stop()
    return running
