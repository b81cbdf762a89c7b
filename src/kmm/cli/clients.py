"""Cluster access for every command that talks to a cluster.

The same two options everywhere, resolved as kubectl resolves them
(``kube.kubeconfigs``): ``--kubeconfig``, else ``$KUBECONFIG``, else
``~/.kube/config``, else the in-cluster service account; ``--context`` picks
a context. No usable access is a usage error that lists what was tried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kmm.kube import client, errors, kubeconfigs

__all__ = ["ContextOption", "KubeconfigOption", "access", "api_client"]

KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="Kubeconfig file. Default: $KUBECONFIG (a ':' list, merged as kubectl "
        "merges it), then ~/.kube/config, then the in-cluster service account.",
    ),
]
ContextOption = Annotated[
    str | None,
    typer.Option("--context", help="Kubeconfig context to use; default: its current-context."),
]


def access(kubeconfig: Path | None, context: str | None) -> kubeconfigs.Access:
    """Where and who, or ``typer.BadParameter`` naming everything tried."""
    try:
        return kubeconfigs.load(kubeconfig, context=context)
    except errors.ConfigError as err:
        raise typer.BadParameter(str(err), param_hint="--kubeconfig/--context") from err


def api_client(kubeconfig: Path | None, context: str | None) -> client.Client:
    """A client for the cluster the options (or the environment) name."""
    return client.Client(access(kubeconfig, context))
