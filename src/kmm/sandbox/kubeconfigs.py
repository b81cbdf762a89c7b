"""Kubeconfig files for the sandbox's clients (the user, each component, each node)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

__all__ = ["render", "write"]


def render(
    *, server: str, ca_cert: str, client_cert: str, client_key: str, name: str = "kmm-sandbox"
) -> str:
    """A kubeconfig with one cluster, user and context, all called ``name``,
    naming the files as given (a VM node's are paths in its own OS)."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority": ca_cert}}
        ],
        "users": [
            {"name": name, "user": {"client-certificate": client_cert, "client-key": client_key}}
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return yaml.safe_dump(document, sort_keys=False)


def write(
    path: Path,
    *,
    server: str,
    ca_cert: Path,
    client_cert: Path,
    client_key: Path,
    name: str = "kmm-sandbox",
) -> Path:
    """Write a kubeconfig with one cluster, user and context, all called ``name``.

    Paths are absolute so the file works from any working directory.
    """
    text = render(
        server=server,
        ca_cert=str(ca_cert.resolve()),
        client_cert=str(client_cert.resolve()),
        client_key=str(client_key.resolve()),
        name=name,
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(text)
    return path
