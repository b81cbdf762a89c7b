"""Counting API writes, so tests can prove that a no-op reconcile writes nothing.

`WriteCounter.install(api_client)` wraps the client's `request` method (the one
every generated API call goes through) and counts POST, PUT, PATCH and DELETE
by `(verb, resource)`, where resource is the plural name with any subresource
(`daemonsets`, `nodes/status`) and the group (`apps/daemonsets`) parsed from
the URL. Reads are not counted. A write is counted when it is sent, whether
or not the server accepts it: "zero writes" means zero attempts. `uninstall`
restores the client. Counting is synchronous with the call, so assertions
need no waiting.
"""

from __future__ import annotations

import collections
import urllib.parse
from typing import Any

__all__ = ["WriteCounter", "resource_of"]

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def resource_of(url: str) -> str:
    """`/apis/apps/v1/namespaces/ns/daemonsets/x/status` -> `apps/daemonsets/status`."""
    parts = [p for p in urllib.parse.urlsplit(url).path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return "/".join(parts)
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource; bare `namespaces[/name]` stays
    resource = rest[0] if rest else ""
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    return f"{group}/{resource}" if group else resource


class WriteCounter:
    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._installed: list[tuple[Any, Any]] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_resource(self, resource: str) -> int:
        return sum(n for (_, res), n in self.counts.items() if res == resource)

    def reset(self) -> None:
        self.counts.clear()

    def install(self, api_client: Any) -> WriteCounter:
        original = api_client.request

        async def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() in WRITE_VERBS:
                self.counts[(method.upper(), resource_of(url))] += 1
            return await original(method, url, *args, **kwargs)

        # An instance attribute shadows the class method for this client only.
        api_client.request = counted
        self._installed.append((api_client, original))
        return self

    def uninstall(self) -> None:
        for api_client, _ in self._installed:
            del api_client.request
        self._installed.clear()
