"""Counting a client's requests, so tests and benchmarks can state
"a no-op reconcile writes nothing" or "a warm prepare makes no API call".

Every request a ``kube.Client`` sends is recorded as ``(verb, resource)``,
when it is sent (whether or not the server accepts it: "zero writes" means
zero attempts). The verb is the HTTP method, or ``WATCH``; the resource is
the plural with group and subresource (``apps/daemonsets``,
``nodes/status``), parsed from the path. Counting is synchronous with the
call, so assertions need no waiting. Answers the API server throttled (429
Too Many Requests) are counted apart, per request as sent (a request retried
after its Retry-After counts once per 429), so a test or a dashboard can
see that the server pushed back and how often.
"""

from __future__ import annotations

import collections
import urllib.parse
from typing import Final

__all__ = ["WRITE_VERBS", "RequestCounter", "resource_of"]

WRITE_VERBS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def resource_of(path: str) -> str:
    """``/apis/apps/v1/namespaces/ns/daemonsets/x/status`` -> ``apps/daemonsets/status``."""
    parts = [p for p in urllib.parse.urlsplit(path).path.split("/") if p]
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


class RequestCounter:
    """``requests`` counts everything sent; ``writes`` only POST, PUT, PATCH,
    DELETE; ``throttled`` the requests answered 429."""

    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.writes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.throttled: collections.Counter[tuple[str, str]] = collections.Counter()

    def record(self, verb: str, path: str) -> None:
        key = (verb, resource_of(path))
        self.requests[key] += 1
        if verb in WRITE_VERBS:
            self.writes[key] += 1

    def record_throttled(self, verb: str, path: str) -> None:
        """The request ``record`` counted was answered 429."""
        self.throttled[(verb, resource_of(path))] += 1

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    def by_verb(self, verb: str) -> int:
        return sum(n for (v, _), n in self.requests.items() if v == verb)

    def writes_to(self, resource: str) -> int:
        return sum(n for (_, res), n in self.writes.items() if res == resource)

    def reset(self) -> None:
        self.requests.clear()
        self.writes.clear()
        self.throttled.clear()
