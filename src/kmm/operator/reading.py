"""The operator's reads outside its informers: a GET on demand (``ApiReader``).

Everything else the operator reads comes from an informer's cache. These
kinds only (``_READABLE``): ConfigMaps and Secrets, never listed (the
operator's role grants get alone on them), and DaemonSets, whose pod
templates the cache does not keep. Each read goes to the API server, nothing
is remembered here; an object that does not exist reads as None, any other
error is raised.
"""

from __future__ import annotations

from typing import Any, Final

from kmm.kube import client, errors, resources

__all__ = ["ApiReader"]

RawObject = dict[str, Any]

_READABLE: Final = {
    "ConfigMap": resources.Resource("", "v1", "configmaps"),
    "Secret": resources.Resource("", "v1", "secrets"),
    "DaemonSet": resources.DAEMONSETS,
}


class ApiReader:
    """GETs of the ConfigMaps and Secrets build and sign pods read, on
    demand (no informer: the operator never lists Secrets), and of a
    DaemonSet whose pod template is tried (``podadmission``: the cache
    keeps no templates)."""

    def __init__(self, api: client.Client) -> None:
        self.api = api

    async def get(self, kind: str, namespace: str, name: str) -> RawObject | None:
        try:
            found: RawObject = await self.api.request("GET", _READABLE[kind].path(namespace, name))
        except errors.NotFound:
            return None
        return found
