"""``kmm operator``: the Module operator (DESIGN §5), leader-elected.

Reads flags and the environment (``POD_NAME``/``POD_NAMESPACE`` from the
Deployment's downward API) and runs ``kmm.operator.running.run`` until
SIGTERM/SIGINT. Exit status 1 after losing the lease: the replica restarts
with fresh caches rather than race the new leader (client-go's habit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import Annotated

import typer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from kmm.operator import jsonlogs, running, wiring
from kmm.runtime import manager

__all__ = ["operator"]

_log = logging.getLogger(__name__)


async def api_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """A client from ``kubeconfig``, else the in-cluster service account."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is not None:
            await k8s_config.load_kube_config(
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException as err:
        raise typer.BadParameter(f"no cluster access: {err}") from err
    return k8s.ApiClient(configuration)


async def _main(kubeconfig: Path | None, settings: running.Settings) -> None:
    api = await api_client(kubeconfig)
    stop = asyncio.Event()
    undo = manager.stop_on_signals(stop)
    try:
        async with api:
            await running.run(api, settings, stop)
    finally:
        undo()


def operator(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig to use; default: the in-cluster service account."),
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Port for /metrics.")] = 8080,
    health_port: Annotated[int, typer.Option(help="Port for /healthz and /readyz.")] = 8081,
    bind_address: Annotated[str, typer.Option(help="Address the HTTP endpoints bind.")] = "0.0.0.0",
    leader_election: Annotated[
        bool, typer.Option(help="Run the controllers only while holding the Lease.")
    ] = True,
    namespace_of_lease: Annotated[
        str | None,
        typer.Option(help="Namespace of the Lease; default: $POD_NAMESPACE, else kube-system."),
    ] = None,
    identity: Annotated[
        str | None, typer.Option(help="Lease holder identity; default: $POD_NAME, else host_pid.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Modules reconciled at once.")] = 4,
) -> None:
    """Run the Module operator: loader and device-plugin DaemonSets, node labels, status."""
    jsonlogs.configure()
    name = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"
    lease_namespace = namespace_of_lease or os.environ.get("POD_NAMESPACE") or "kube-system"
    settings = running.Settings(
        identity=name,
        election=wiring.Election(identity=name, namespace=lease_namespace)
        if leader_election
        else None,
        metrics_port=metrics_port,
        health_port=health_port,
        host=bind_address,
        workers=workers,
    )
    try:
        asyncio.run(_main(kubeconfig, settings))
    except manager.LeadershipLost:
        _log.error("lost the lease; exiting so the replica restarts")
        raise typer.Exit(1) from None
