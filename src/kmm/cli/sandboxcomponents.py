"""``kmm sandbox stop|start|restart``: one component of a running sandbox at a time.

``stop`` stops one component, keeping its data, port and log; ``start``
starts it again on them; ``restart`` does both, or, given a node's name,
restarts that node its kind's way (``restarting.restart_node``) and returns
once it is Ready again. A component is named as ``status`` names it.

Limits: flags to calls and results to lines only; what a component is and
how it stops and starts is ``kmm.sandbox.restarting``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from kmm.cli import paths, sandboxcommon
from kmm.sandbox import cluster, errors, processes, restarting

__all__ = ["ComponentArgument", "restart", "start", "stop"]

ComponentArgument = Annotated[
    str,
    typer.Argument(
        help="As `status` names it: etcd, kube-apiserver, kube-controller-manager (or "
        "controller-manager), kube-scheduler (or scheduler), kwok, kubelet/kmm-kubelet-0 ..."
    ),
]


def stop(component: ComponentArgument, directory: sandboxcommon.DirOption = None) -> None:
    """Stop one component, keeping its data, port and log for `start`."""
    target = directory or paths.sandbox_dir()
    try:
        was_running = restarting.stop(target, component)
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    sandboxcommon.console.print(
        f"Stopped {component}" if was_running else f"{component} was not running"
    )


def start(component: ComponentArgument, directory: sandboxcommon.DirOption = None) -> None:
    """Start a stopped component again on its data (its log continues)."""
    target = directory or paths.sandbox_dir()
    _run_start(restarting.start, target, component, "Started")


def restart(component: ComponentArgument, directory: sandboxcommon.DirOption = None) -> None:
    """Stop one component and start it again with its data (its log continues).
    A node's name restarts the node its kind's way: a kubelet node's kubelet,
    a container node's containerd, kubelet and kube-proxy, a VM node's OS
    (a reboot); it returns once the node is Ready again."""
    target = directory or paths.sandbox_dir()
    try:
        record = cluster.status(target)
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    if any(component in kind.names for kind in cluster.kinds(record)):
        started = time.monotonic()
        try:
            asyncio.run(restarting.restart_node(target, component))
        except (errors.SandboxError, ValueError) as err:
            raise sandboxcommon.fail(err) from err
        sandboxcommon.console.print(
            f"Restarted node {component}; Ready after {time.monotonic() - started:.1f} s"
        )
        return
    _run_start(restarting.restart, target, component, "Restarted")


def _run_start(
    how: Callable[[Path, str], Coroutine[Any, Any, processes.Process]],
    target: Path,
    component: str,
    verb: str,
) -> None:
    started = time.monotonic()
    try:
        process = asyncio.run(how(target, component))
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    sandboxcommon.console.print(
        f"{verb} {process.name} (pid {process.pid}); healthy after "
        f"{time.monotonic() - started:.1f} s"
    )
