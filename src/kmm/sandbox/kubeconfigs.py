"""Kubeconfig files for the sandbox's clients (the user, each component)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

__all__ = ["write"]


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
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_cert.resolve()),
                },
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "client-certificate": str(client_cert.resolve()),
                    "client-key": str(client_key.resolve()),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        yaml.safe_dump(document, stream, sort_keys=False)
    return path
