"""Every API write the operator makes, in one place, with in-flight memory.

Writes go as raw JSON (no model parsing): server-side apply of DaemonSets
(field manager ``kmm``; a create and an update are one idempotent call, so a
create repeated after a crash cannot duplicate), JSON merge patches of node
labels, Module status and finalizers, deletes, and Event creates.

The informer cache lags a write by one watch event. A reconcile that runs in
that gap would see the old object and send the same write again. ``Pending``
remembers, per object, the writes whose result the cache does not show yet;
the same write is skipped until it does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kmm.api import modules

__all__ = ["FIELD_MANAGER", "Pending", "Writer"]

FIELD_MANAGER: Final = "kmm"

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]
_MERGE: Final = "application/merge-patch+json"
_APPLY: Final = "application/apply-patch+yaml"


class Pending:
    """Writes sent whose result the cache does not show yet, per object key.

    An entry lives until the cache shows the object at (or past) the
    resourceVersion our write returned. Only then: an unrelated update that
    landed just before ours (a node heartbeat) must not make us repeat the
    write. resourceVersions are opaque in the API contract; etcd's are
    increasing integers, which this compares, and anything else counts as
    caught up (at worst one repeated write).
    """

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, tuple[str, str | None]]] = {}

    def seen(self, key: str, version: str | None) -> None:
        """The cache shows ``key`` at ``version`` (None: deleted)."""
        parts = self._entries.get(key)
        if parts is None:
            return
        for part, (_, result) in list(parts.items()):
            if _caught_up(version, result):
                del parts[part]
        if not parts:
            del self._entries[key]

    def sent(self, key: str, part: str, body: object, result: str | None) -> None:
        self._entries.setdefault(key, {})[part] = (_digest(body), result)

    def in_flight(self, key: str, part: str, version: str | None, body: object) -> bool:
        entry = self._entries.get(key, {}).get(part)
        return entry is not None and entry[0] == _digest(body) and not _caught_up(version, entry[1])

    def __len__(self) -> int:
        return sum(len(parts) for parts in self._entries.values())


def _caught_up(version: str | None, result: str | None) -> bool:
    if version is None or result is None:
        return True
    try:
        return int(version) >= int(result)
    except ValueError:
        return True


def _result_version(body: bytes) -> str | None:
    try:
        value = json.loads(body).get("metadata", {}).get("resourceVersion")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _digest(body: object) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _version(obj: RawObject | None) -> str | None:
    if obj is None:
        return None
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return value if isinstance(value, str) else None


async def _send(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, bytes]:
    response = await call(*args, _preload_content=False, **kwargs)
    try:
        body: bytes = await response.read()
        status: int = response.status
    finally:
        response.release()
    return status, body


def _check(status: int, body: bytes, what: str, *, missing_ok: bool = False) -> None:
    if status == 404 and missing_ok:
        return
    if not 200 <= status <= 299:
        raise ApiException(status=status, reason=f"{what}: {body[:300]!r}")


class Writer:
    """The operator's writes; ``pending`` is shared with the informer handlers."""

    def __init__(self, api: client.ApiClient, *, pending: Pending | None = None) -> None:
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pending = pending if pending is not None else Pending()

    async def apply_daemonset(self, desired: RawObject, observed: RawObject | None) -> bool:
        """Server-side apply; True when it created the DaemonSet, False otherwise
        (also when skipped as already in flight)."""
        metadata = desired["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        if self.pending.in_flight(key, "apply", _version(observed), desired):
            return False
        status, body = await _send(
            self.apps.patch_namespaced_daemon_set,
            metadata["name"],
            metadata["namespace"],
            desired,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )
        _check(status, body, f"apply daemonset {key}")
        self.pending.sent(key, "apply", desired, _result_version(body))
        return status == 201

    async def delete_daemonset(self, namespace: str, name: str, observed: RawObject) -> bool:
        """Delete (background propagation: the garbage collector takes the pods)."""
        key = f"{namespace}/{name}"
        if self.pending.in_flight(key, "delete", _version(observed), None):
            return False
        status, body = await _send(
            self.apps.delete_namespaced_daemon_set,
            name,
            namespace,
            propagation_policy="Background",
        )
        _check(status, body, f"delete daemonset {key}", missing_ok=True)
        # Gone only when the cache says so (its DELETED event).
        self.pending.sent(key, "delete", None, str(2**63))
        return status != 404

    async def patch_node_labels(self, node: RawObject, change: dict[str, str | None]) -> None:
        name = node["metadata"]["name"]
        if self.pending.in_flight(name, "labels", _version(node), change):
            return
        status, body = await _send(
            self.core.patch_node,
            name,
            {"metadata": {"labels": change}},
            _content_type=_MERGE,
        )
        _check(status, body, f"label node {name}", missing_ok=True)
        self.pending.sent(name, "labels", change, _result_version(body))

    async def patch_module_status(self, module: RawObject, patch: RawObject) -> None:
        await self._patch_module(
            module, "status", patch, self.custom.patch_namespaced_custom_object_status
        )

    async def set_finalizers(self, module: RawObject, finalizers: list[str]) -> None:
        """Replace the finalizer list, guarded by the observed resourceVersion (409 on a race)."""
        metadata = module["metadata"]
        patch = {
            "metadata": {"finalizers": finalizers, "resourceVersion": metadata["resourceVersion"]}
        }
        await self._patch_module(
            module, "finalizers", patch, self.custom.patch_namespaced_custom_object
        )

    async def _patch_module(
        self, module: RawObject, aspect: str, patch: RawObject, method: Any
    ) -> None:
        """Merge-patch one aspect of a Module, unless the same patch is still in flight."""
        metadata = module["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        if self.pending.in_flight(key, aspect, _version(module), patch):
            return
        status, body = await _send(
            method,
            modules.GROUP,
            modules.VERSION,
            metadata["namespace"],
            modules.PLURAL,
            metadata["name"],
            patch,
            _content_type=_MERGE,
        )
        _check(status, body, f"{aspect} of module {key}", missing_ok=True)
        self.pending.sent(key, aspect, patch, _result_version(body))

    async def create_event(self, event: RawObject) -> None:
        """Best effort: an Event that cannot be written is logged, never retried."""
        try:
            status, body = await _send(
                self.core.create_namespaced_event, event["metadata"]["namespace"], event
            )
        except (ApiException, OSError) as err:
            _log.warning("event not written: %s", err)
            return
        if not 200 <= status <= 299:
            _log.warning("event not written (%d): %s", status, body[:200])
