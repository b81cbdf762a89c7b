"""The API client the operator's commands share: ``--kubeconfig`` or in-cluster."""

from __future__ import annotations

from pathlib import Path

import typer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

__all__ = ["api_client"]


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
