"""``kmm driver``: the DRA node driver for one kernel module's devices.

Turns flags (each also read from the environment the operator's DRA
DaemonSet sets: ``NODE_NAME``, ``DRIVER_NAME``, ``CDI_ROOT``,
``KUBELET_REGISTRAR_DIRECTORY_PATH``, ``KUBELET_PLUGINS_DIRECTORY_PATH``,
``HEALTHCHECK_PORT``, ``POD_UID``, ``KMM_MODULE_NAME``) and the optional ``--config`` file into a
``kmm.driver.config.Config`` (a flag given wins over the file), follows the
file while running (``kmm.driver.reloading``), builds the API client
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
from kmm.driver import kmod, owning, reloading
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


async def _run(
    config: driver_config.Config,
    api: client.Client | None,
    settings_file: Path | None,
    make: Callable[[driver_config.FileSettings], driver_config.Config],
) -> str:
    reloader: asyncio.Task[None] | None = None
    try:
        policy = kmod.KmodPolicy(
            root=config.root,
            module=config.module,
            node=config.node,
            device_class=config.device_class,
            dev_pattern=config.dev_pattern,
            poll_interval=config.poll_interval,
            sys_dir=config.sys_dir,
            dev_dir=config.dev_dir,
            kernel_module=config.kernel_module,
        )
        driver = owning.Driver(config, policy=policy, api=api, rescan_interval=config.poll_interval)
        if settings_file is not None:
            following = reloading.Reloader(settings_file, make, driver.reconfigure)
            reloader = asyncio.ensure_future(following.run())
        return await driver.run(install_signals=_install_signals)
    finally:
        if reloader is not None:
            reloader.cancel()
        if api is not None:
            await api.close()


def driver(
    node: Annotated[
        str,
        typer.Option(
            envvar="NODE_NAME", help="This node's name (pool and slices are named after it)."
        ),
    ],
    driver_name: Annotated[
        str, typer.Option(envvar="DRIVER_NAME", help="The DRA driver name (a DNS subdomain).")
    ],
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
            help="Take every host path (/var/lib/kubelet, /var/run/cdi, /sys, /dev) not given "
            "on its own under DIR."
        ),
    ] = Path("/"),
    cdi_root: Annotated[
        Path | None,
        typer.Option(envvar="CDI_ROOT", help="The CDI spec directory (default ROOT/var/run/cdi)."),
    ] = None,
    registrar_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBELET_REGISTRAR_DIRECTORY_PATH",
            help="The kubelet's plugin registry (default ROOT/var/lib/kubelet/plugins_registry).",
        ),
    ] = None,
    plugins_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBELET_PLUGINS_DIRECTORY_PATH",
            help="The kubelet's plugins directory; the DRA socket goes in its DRIVER_NAME "
            "subdirectory (default ROOT/var/lib/kubelet/plugins).",
        ),
    ] = None,
    sys_dir: Annotated[
        Path | None,
        typer.Option(help="Where the host's /sys is mounted (default ROOT/sys)."),
    ] = None,
    dev_dir: Annotated[
        Path | None,
        typer.Option(help="Where the host's /dev is mounted (default ROOT/dev)."),
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(
            envvar="HEALTHCHECK_PORT",
            help="Serve the gRPC health service (service 'liveness') on this port.",
        ),
    ] = None,
    pod_uid: Annotated[
        str | None, typer.Option(envvar="POD_UID", help="The driver pod's uid (logged).")
    ] = None,
    kernel_module: Annotated[
        str | None,
        typer.Option(
            envvar="KMM_MODULE_NAME",
            help="The loaded kernel module the devices need (kmm's DRA DaemonSet sets the "
            "Module's moduleName): while it is not loaded every device is reported Unhealthy. "
            "Unset: only the devices' /dev nodes count.",
        ),
    ] = None,
    settings: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A YAML settings file (dra.enabled, deviceClass, devicePattern, pollInterval, "
            "logLevel), followed while running.",
        ),
    ] = None,
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

    def make(file: driver_config.FileSettings) -> driver_config.Config:
        # A flag given wins over the file.
        return driver_config.Config(
            node=node,
            driver_name=driver_name,
            module=module,
            device_class=device_class if device_class is not None else file.device_class,
            dev_pattern=dev_pattern if dev_pattern is not None else file.dev_pattern,
            root=root.resolve(),
            dra=driver_config.DRAConfig(enabled=dra if dra is not None else file.dra.enabled),
            registrar_dir=registrar_dir,
            plugins_dir=plugins_dir,
            cdi_dir=cdi_root,
            sys_dir=sys_dir,
            dev_dir=dev_dir,
            health_port=health_port,
            pod_uid=pod_uid,
            kernel_module=kernel_module or None,
            poll_interval=file.poll_interval,
            log_level="debug" if verbose else file.log_level,
        )

    try:
        config = make(
            driver_config.load_file(settings)
            if settings is not None
            else driver_config.FileSettings()
        )
    except driver_config.ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    if config.log_level == "debug":
        logging.getLogger("kmm").setLevel(logging.DEBUG)
    if pod_uid:
        logger.info("driver pod %s", pod_uid)
    api = _api_client(kubeconfig, context)
    try:
        reason = asyncio.run(_run(config, api, settings, make))
    except (errors.PluginError, driver_config.ConfigError, kube_errors.KubeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"driver stopped: {reason}", err=True)
    if reason not in ("SIGTERM", "SIGINT"):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("driver")(driver)
