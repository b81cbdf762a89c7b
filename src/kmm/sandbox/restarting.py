"""Stop, start and restart one component of a running sandbox, keeping its data.

For faults on demand: an API server or etcd that goes away and comes back,
the way a control-plane upgrade or a crash does. A component is started
again from its recorded command line, port and log (which continues), so
etcd comes back on its data directory with every object, and the API server
on the same address clients already hold. ``restart`` is ``stop`` then
``start``: one code path for the three. ``stop`` blocks (the CLI's);
``stop_async``, which ``restart`` and the test helpers use, lets the event
loop run while the component shuts down. ``kill`` is a crash: SIGKILL, no
graceful shutdown (an API server stopping gracefully first drains its
requests; one that crashes resets them).

Names are those ``kmm sandbox status`` shows (``kube-apiserver``,
``kubelet/<node>`` ...); ``controller-manager`` and ``scheduler`` are
accepted for ``kube-controller-manager`` and ``kube-scheduler``. The record
on disk is rewritten on every start, so ``down`` always stops the live
process and never a pid that has gone. ``restart`` also takes a node's name
(``kmm-kubelet-0``): its kind restarts it its own way (``nodekinds``).
"""

from __future__ import annotations

from pathlib import Path

from kmm.sandbox import cluster, controlplane, errors, launching, processes, state

__all__ = [
    "ALIASES",
    "kill",
    "restart",
    "restart_node",
    "running",
    "start",
    "stop",
    "stop_async",
]

ALIASES = {
    "controller-manager": "kube-controller-manager",
    "scheduler": "kube-scheduler",
    "apiserver": "kube-apiserver",
}


def _find(record: state.SandboxState, component: str) -> int:
    return launching.find(record, ALIASES.get(component, component))


def running(directory: Path, component: str) -> bool:
    record = cluster.status(directory)
    return record.launched[_find(record, component)].alive()


def stop(directory: Path, component: str) -> bool:
    """Stop one component (SIGTERM, then SIGKILL after a grace); False if it
    was not running. Its data, port and record stay for ``start``."""
    record = cluster.status(directory)
    process = record.launched[_find(record, component)]
    was_running = process.alive()
    process.stop()
    return was_running


async def stop_async(directory: Path, component: str) -> bool:
    """``stop`` for a caller on an event loop, which keeps running meanwhile."""
    record = cluster.status(directory)
    process = record.launched[_find(record, component)]
    was_running = process.alive()
    await process.stop_async()
    return was_running


def kill(directory: Path, component: str) -> bool:
    """Crash one component (SIGKILL: no graceful shutdown, connections reset
    at once); False if it was not running. ``start`` brings it back."""
    record = cluster.status(directory)
    process = record.launched[_find(record, component)]
    was_running = process.alive()
    process.kill()
    return was_running


async def start(directory: Path, component: str, *, timeout: float = 180.0) -> processes.Process:
    """Start a stopped component again as it was launched; return once healthy.

    Refuses (``SandboxInUse``) a component that is running: a second copy
    would fight the first for its port and data.
    """
    record = cluster.status(directory)
    index = _find(record, component)
    process = record.launched[index]
    return await launching.relaunch(
        record, index, timeout=timeout, access=controlplane.health_access(record, process)
    )


async def restart(directory: Path, component: str, *, timeout: float = 180.0) -> processes.Process:
    """``stop`` then ``start``: the component comes back on its data."""
    await stop_async(directory, component)
    return await start(directory, component, timeout=timeout)


async def restart_node(directory: Path, name: str, *, timeout: float = 180.0) -> None:
    """Restart node ``name`` its kind's way (a kubelet's restart, a guest's
    reboot ...); return once it is Ready again."""
    record = cluster.status(directory)
    for kind in cluster.kinds(record):
        if name in kind.names:
            await kind.restart(name, timeout=timeout)
            return
    raise errors.NotRunning(f"the sandbox in {record.directory} has no node {name}")
