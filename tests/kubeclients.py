"""kmm's own API client pointed at a test's HTTP server (no TLS, no identity)."""

from __future__ import annotations

from typing import Any

from kmm.kube import client, kubeconfigs


def for_server(url: str, **kwargs: Any) -> client.Client:
    """A ``kube.client.Client`` for ``url``; keyword arguments go to the client."""
    return client.Client(
        kubeconfigs.Access(server=url.rstrip("/"), source="a test server"), **kwargs
    )
