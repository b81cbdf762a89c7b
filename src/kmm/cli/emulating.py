"""``kmm kubelet``: the kubelet DRA emulator for one node of any cluster.

Turns flags into ``kmm.kubelet.emulator.Options`` and runs the emulator until
SIGTERM/SIGINT. Host paths are taken under ``--root`` (``<root>/var/lib/kubelet``,
``<root>/var/run/cdi``), as ``kmm driver --root`` takes them, so the two meet
on the same plugin registry.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import signal
from pathlib import Path
from typing import Annotated

import typer

from kmm.api import installation
from kmm.cli import clients
from kmm.kube import errors as kube_errors
from kmm.kubelet import checkpoint, emulator, fakedevices, nodes

__all__ = ["kubelet", "register"]


async def _run(options: emulator.Options, kubeconfig: Path | None, context: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with clients.api_client(kubeconfig, context) as api:
        running = emulator.Emulator(api, options)
        triggered: set[asyncio.Task[None]] = set()

        def trigger(reboot: bool, reprepare: bool) -> None:
            task = asyncio.ensure_future(running.restart(reboot=reboot, reprepare=reprepare))
            triggered.add(task)
            task.add_done_callback(triggered.discard)

        # SIGHUP: a kubelet restart; SIGUSR2: the same, every running pod's
        # claims prepared again; SIGUSR1: a node reboot (docs/kubelet-emulator.md).
        loop.add_signal_handler(signal.SIGHUP, trigger, False, False)
        loop.add_signal_handler(signal.SIGUSR2, trigger, False, True)
        loop.add_signal_handler(signal.SIGUSR1, trigger, True, False)
        await running.run(stop)


def kubelet(
    node: Annotated[str, typer.Option(help="The node's name; its Node is created if missing.")],
    root: Annotated[
        Path, typer.Option(help="Take the host paths (/var/lib/kubelet, /var/run/cdi) under DIR.")
    ],
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    kernel: Annotated[
        str | None, typer.Option(help="The kernel version the Node reports (default: this host's).")
    ] = None,
    wipe_delay: Annotated[
        float,
        typer.Option(help="Seconds before a gone driver's ResourceSlices are wiped (kubelet: 30)."),
    ] = 30.0,
    retry: Annotated[
        float, typer.Option(help="Seconds between prepare attempts of a failing pod.")
    ] = 2.0,
    metrics_port: Annotated[
        int, typer.Option(help="Serve /metrics on 127.0.0.1:PORT (0: a free one, logged).")
    ] = 0,
    label: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE: a label of the Node it creates (repeatable).", metavar="KEY=VALUE"
        ),
    ] = None,
    fake_module: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=COUNT: lay out a loaded kernel module NAME with COUNT devices under "
            "--root (sys/module, sys/class/NAME, dev), for drivers to find (repeatable).",
            metavar="NAME=COUNT",
        ),
    ] = None,
    resource_health_status: Annotated[
        bool,
        typer.Option(
            help="The kubelet's ResourceHealthStatus feature gate (on by default since 1.36): "
            "follow the drivers' health streams and report device health in containerStatuses."
        ),
    ] = True,
    optional_node_operations: Annotated[
        bool,
        typer.Option(
            help="The kubelet's DRAOptionalNodeOperations feature gate (alpha, off in 1.37): "
            "skip the calls a claim's devices say they need not, and declare the feature."
        ),
    ] = False,
    process_image: Annotated[
        str,
        typer.Option(
            help="Containers of this image run as local processes ('' for none); "
            "others run without a process."
        ),
    ] = installation.IMAGE,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the kubelet DRA emulator for one node (SIGHUP: restart, SIGUSR2: restart and
    prepare again, SIGUSR1: reboot)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    labels = _pairs(label or [], "--label")
    for name, count in _pairs(fake_module or [], "--fake-module"):
        if not count.isdigit():
            raise typer.BadParameter(
                f"{name}={count}: COUNT must be a number", param_hint="--fake-module"
            )
        fakedevices.lay_out(root, name, int(count))
    options = emulator.Options(
        node=nodes.NodeSpec(name=node, kernel=kernel or platform.release(), labels=tuple(labels)),
        root=root.resolve(),
        wipe_delay=wipe_delay,
        retry=retry,
        metrics_port=metrics_port,
        resource_health=resource_health_status,
        optional_node_operations=optional_node_operations,
        process_image=process_image or None,
    )
    try:
        asyncio.run(_run(options, kubeconfig, context))
    except (checkpoint.CorruptCheckpoint, kube_errors.KubeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo("kubelet emulator stopped", err=True)


def _pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    found = []
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{value!r} is not KEY=VALUE", param_hint=flag)
        found.append((key, rest))
    return found


def register(app: typer.Typer) -> None:
    app.command("kubelet")(kubelet)
