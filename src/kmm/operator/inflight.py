"""Writes the informer cache does not show yet (``Pending``), so a lagging
cache causes no repeated write.

The informer cache lags a write by one watch event. A reconcile that runs in
that gap would see the old object and send the same write again. ``Pending``
remembers, per object, the writes whose result the cache does not show yet;
the same write is skipped until it does. ``writing.Writer`` asks it before
each write and tells it each result; the informers' events (``follow``)
clear it.

``Pending`` holds an entry only while an event is still to come that clears
it, so a leader that runs for weeks holds no more entries than it has writes
whose events are on their way: a write that changed nothing (a delete or
patch answered 404, a delete whose uid no longer matches) leaves
none, and events that arrive while a write is on the wire (``Pending.sending``)
count against its result, so a DELETED event that beats the DELETE's own
reply leaves nothing behind either. A create whose object the cache never
showed (made and deleted while the watch was broken, the gap closed by a
relist) gets no event at all: the relist clears it (``Pending.relisted``),
or it would skip the same create for ever.

Keys are store keys (``<ns>/<name>``, or a cluster-scoped name), with key
spaces of their own for the objects whose keys could meet another kind's:
pods (``pod_key``) apart from DaemonSets, DeviceClasses (``class_key``) and
PreflightValidations (``preflight_key``) apart from Nodes. Limits: what it
knows of the cache is what its events and relists say; resourceVersions
are compared as etcd's integers (see ``Pending``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Final

from kmm.kube import objects
from kmm.runtime import informers, stores

__all__ = [
    "CLASS_PREFIX",
    "POD_PREFIX",
    "PREFLIGHT_PREFIX",
    "RULE_PREFIX",
    "Pending",
    "class_key",
    "pod_key",
    "preflight_key",
    "rule_key",
]


class Pending:
    """Writes sent whose result the cache does not show yet, per object key.

    An entry lives until the cache shows the object at (or past) the
    resourceVersion our write returned. Only then: an unrelated update that
    landed just before ours (a node heartbeat) must not make us repeat the
    write. resourceVersions are opaque in the API contract; etcd's are
    increasing integers, which this compares, and anything else counts as
    caught up (at worst one repeated write).

    A write is sent inside ``sending(key)``: the events of ``key`` seen
    while it is on the wire are remembered (``_Flight``) and ``sent`` checks
    its result against them, since the cache may show a write before its
    reply comes back and no later event would then clear its entry.
    """

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, tuple[str, str | None]]] = {}
        self._flights: dict[str, _Flight] = {}
        # Per key prefix, the resourceVersion of its informer's last list.
        self._listed: dict[str, str] = {}

    def follow(self, informer: informers.Informer, prefix: str = "") -> None:
        """Keep the entries of ``informer``'s objects (keys: ``prefix`` and
        the store key) true to its cache: each event clears what it shows;
        with a ``prefix`` (a key space of the informer's own), each relist
        clears what it shows too (``relisted``)."""
        version = objects.resource_version
        informer.add_handler(
            informers.FuncHandler(
                add=lambda obj: self.seen(prefix + stores.key_of(obj), version(obj)),
                update=lambda _old, new: self.seen(prefix + stores.key_of(new), version(new)),
                delete=lambda obj: self.seen(prefix + stores.key_of(obj), None),
            )
        )
        if prefix:
            informer.add_relist_hook(lambda listed: self.relisted(prefix, listed))

    def relisted(self, prefix: str, version: str) -> None:
        """The informer of the keys under ``prefix`` listed them afresh at
        ``version``: its cache shows every write of theirs whose result is
        not newer, or the object gone since. Their entries go, a create's
        included whose object the cache never showed (made and deleted in
        the watch gap this list closes: no event will ever clear it). A
        delete waits for its object to be seen gone, as before."""
        self._listed[prefix] = version
        for key in [k for k in self._entries if k.startswith(prefix)]:
            self._clear(key, version)

    def _clear(self, key: str, version: str | None) -> None:
        parts = self._entries.get(key)
        if parts is None:
            return
        for part, (_, result) in list(parts.items()):
            if _caught_up(version, result):
                del parts[part]
        if not parts:
            del self._entries[key]

    def _listed_past(self, key: str, result: str) -> bool:
        """Whether a list of ``key``'s informer already reflects ``result``."""
        return any(
            key.startswith(prefix) and _caught_up(listed, result)
            for prefix, listed in self._listed.items()
        )

    def seen(self, key: str, version: str | None) -> None:
        """The cache shows ``key`` at ``version`` (None: deleted)."""
        flight = self._flights.get(key)
        if flight is not None:
            flight.saw(version)
        self._clear(key, version)

    @contextlib.contextmanager
    def sending(self, key: str) -> Iterator[None]:
        """Around one write of ``key``, its ``sent`` included."""
        flight = self._flights.setdefault(key, _Flight())
        flight.writes += 1
        try:
            yield
        finally:
            flight.writes -= 1
            if not flight.writes:
                del self._flights[key]

    def sent(self, key: str, part: str, body: object, result: str | None) -> None:
        """``part`` of ``key`` was written as ``body``; the cache shows it at
        ``result`` (None: the write changed nothing, so nothing is in flight)."""
        flight = self._flights.get(key)
        if (
            result is None
            or (flight is not None and flight.shows(result))
            or self._listed_past(key, result)
        ):
            self._forget(key, part)
            return
        self._entries.setdefault(key, {})[part] = (_digest(body), result)

    def in_flight(self, key: str, part: str, version: str | None, body: object) -> bool:
        entry = self._entries.get(key, {}).get(part)
        return entry is not None and entry[0] == _digest(body) and not _caught_up(version, entry[1])

    def __len__(self) -> int:
        return sum(len(parts) for parts in self._entries.values())

    def _forget(self, key: str, part: str) -> None:
        parts = self._entries.get(key)
        if parts is not None:
            parts.pop(part, None)
            if not parts:
                del self._entries[key]


@dataclasses.dataclass
class _Flight:
    """What the cache showed of one key while writes of it were on the wire:
    the newest version, and whether the object was deleted. Any event seen
    before a write was sent is older than the write's result (etcd orders
    them), so writes of one key overlapping in time can share one; a
    deletion seen before one of them was sent costs at worst that write
    repeated once."""

    writes: int = 0
    newest: str | None = None
    gone: bool = False

    def saw(self, version: str | None) -> None:
        if version is None:
            self.gone = True
        elif self.newest is None or _caught_up(version, self.newest):
            self.newest = version

    def shows(self, result: str) -> bool:
        return self.gone or (self.newest is not None and _caught_up(self.newest, result))


def _caught_up(version: str | None, result: str | None) -> bool:
    if version is None or result is None:
        return True
    try:
        return int(version) >= int(result)
    except ValueError:
        return True


# Key spaces of their own (``Pending.follow``): pods apart from DaemonSets,
# DeviceClasses and PreflightValidations apart from Nodes.
POD_PREFIX: Final = "pod:"
CLASS_PREFIX: Final = "deviceclass:"
PREFLIGHT_PREFIX: Final = "preflightvalidation:"
RULE_PREFIX: Final = "devicetaintrule:"


def class_key(name: str) -> str:
    """The ``Pending`` key of a DeviceClass."""
    return CLASS_PREFIX + name


def rule_key(name: str) -> str:
    """The ``Pending`` key of a DeviceTaintRule."""
    return RULE_PREFIX + name


def preflight_key(name: str) -> str:
    """The ``Pending`` key of a PreflightValidation, apart from Nodes' (both
    are cluster-scoped names)."""
    return PREFLIGHT_PREFIX + name


def pod_key(key: str) -> str:
    """The ``Pending`` key of a pod (``<ns>/<name>``), apart from DaemonSets'."""
    return POD_PREFIX + key


def _digest(body: object) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))
