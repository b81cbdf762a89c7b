"""The API client the operator's commands share: ``--kubeconfig`` or in-cluster."""

from __future__ import annotations

from pathlib import Path

import typer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

__all__ = ["api_client", "configuration"]


async def configuration(kubeconfig: Path | None) -> k8s.Configuration:
    """Client settings from ``kubeconfig``, else the in-cluster service account.

    Raises ``kubernetes_asyncio.config.ConfigException`` when neither works.
    """
    settings = k8s.Configuration()
    if kubeconfig is not None:
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=settings
        )
    else:
        k8s_config.load_incluster_config(client_configuration=settings)  # type: ignore[no-untyped-call]
    return settings


async def api_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """A client from ``kubeconfig`` or in-cluster; no cluster access is a usage error."""
    try:
        return k8s.ApiClient(await configuration(kubeconfig))
    except k8s_config.ConfigException as err:
        raise typer.BadParameter(f"no cluster access: {err}") from err
