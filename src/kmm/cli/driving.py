"""``kmm driver``: the DRA node driver for one kernel module's devices.

Turns flags into a ``kmm.driver.config.Config``, builds the API client
(``--kubeconfig``/``--context`` as everywhere, else ``$KUBECONFIG``,
``~/.kube/config`` or the in-cluster service account; none of them means no
cluster access, and DRA then stays off with a warning), and runs
``kmm.driver.owning.Driver`` until SIGTERM/SIGINT - which go through the
driver's ``request_shutdown``, the same path as the plugin's own fatal
errors. With ``--root DIR`` every host path is taken under DIR.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from kmm.cli import clients
from kmm.driver import config as driver_config
from kmm.driver import kmod, owning
from kmm.kube import client, kubeconfigs
from kmm.kube import errors as kube_errors
from kmm.kubeletplugin import errors

__all__ = ["driver", "register"]

logger = logging.getLogger(__name__)


def _api_client(kubeconfig: Path | None, context: str | None) -> client.Client | None:
    """A client, or None without cluster access: the driver then runs with DRA off."""
    if kubeconfig is not None or context is not None:
        return clients.api_client(kubeconfig, context)  # asked for: must work
    try:
        return client.Client(kubeconfigs.load())
    except kube_errors.ConfigError as err:
        logger.warning("%s", err)
        return None


def _install_signals(request_shutdown: Callable[[str], None]) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_shutdown, signal.Signals(signum).name)


async def _run(config: driver_config.Config, api: client.Client | None) -> str:
    try:
        policy = kmod.KmodPolicy(
            root=config.root,
            module=config.module,
            node=config.node,
            device_class=config.device_class,
            dev_pattern=config.dev_pattern,
        )
        driver = owning.Driver(config, policy=policy, api=api)
        return await driver.run(install_signals=_install_signals)
    finally:
        if api is not None:
            await api.close()


def driver(
    node: Annotated[
        str, typer.Option(help="This node's name (pool and slices are named after it).")
    ],
    driver_name: Annotated[str, typer.Option(help="The DRA driver name (a DNS subdomain).")],
    module: Annotated[str, typer.Option(help="The kernel module whose devices are offered.")],
    device_class: Annotated[
        str | None, typer.Option(help="sysfs class of the devices (/sys/class/CLASS).")
    ] = None,
    dev_pattern: Annotated[
        str | None, typer.Option(help="Glob of device nodes under /dev (default MODULE*).")
    ] = None,
    root: Annotated[
        Path,
        typer.Option(
            help="Take every host path (/var/lib/kubelet, /var/run/cdi, /sys, /dev) under DIR."
        ),
    ] = Path("/"),
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    dra: Annotated[
        bool | None,
        typer.Option(
            "--dra/--no-dra", help="Force DRA on or off (default: on, as the policy asks)."
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the DRA node driver for a kernel module's devices."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = driver_config.Config(
        node=node,
        driver_name=driver_name,
        module=module,
        device_class=device_class,
        dev_pattern=dev_pattern,
        root=root.resolve(),
        dra=driver_config.DRAConfig(enabled=dra),
    )
    api = _api_client(kubeconfig, context)
    try:
        reason = asyncio.run(_run(config, api))
    except (errors.PluginError, driver_config.ConfigError, kube_errors.KubeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"driver stopped: {reason}", err=True)
    if reason not in ("SIGTERM", "SIGINT"):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("driver")(driver)
