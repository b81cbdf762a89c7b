"""Every API write the operator makes, in one place, with in-flight memory.

Writes go as raw JSON (no model parsing): server-side apply of DaemonSets
(field manager ``kmm``; a create and an update are one idempotent call, so a
create repeated after a crash cannot duplicate), JSON merge patches of node
labels, Module status and finalizers, deletes (each guarded by the uid of
the object the cache showed: nothing is deleted that was never observed,
nor another object that took its name), Event creates, and pods created in
a dry run (``podadmission``: nothing stored, nothing pending).
DeviceClasses are created with a plain create (a name someone else took
must fail, not be taken over) and updated by server-side apply once they
are known to be the Module's; their ``Pending`` keys are ``class_key(name)``,
apart from Nodes' (both are cluster-scoped names).

The informer cache lags a write by one watch event. A reconcile that runs in
that gap would see the old object and send the same write again. ``Pending``
remembers, per object, the writes whose result the cache does not show yet;
the same write is skipped until it does.

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

Every write carries the ``fence`` the wiring gives (the leader elector's
``holds``): a replica whose lease may have run out sends nothing more, not
even a retry of a throttled write (``kube.errors.Fenced``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, Final

from kmm.api import modules, preflight
from kmm.kube import client, errors, objects, resources
from kmm.runtime import informers, stores

__all__ = [
    "CLASS_PREFIX",
    "FIELD_MANAGER",
    "MODULES",
    "POD_PREFIX",
    "PREFLIGHTS",
    "PREFLIGHT_PREFIX",
    "ApiReader",
    "Pending",
    "Writer",
    "class_key",
    "pod_key",
    "preflight_key",
]

FIELD_MANAGER: Final = "kmm"

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]
MODULES: Final = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
PREFLIGHTS: Final = resources.Resource(
    preflight.GROUP, preflight.VERSION, preflight.PLURAL, namespaced=False
)


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


def class_key(name: str) -> str:
    """The ``Pending`` key of a DeviceClass."""
    return CLASS_PREFIX + name


def preflight_key(name: str) -> str:
    """The ``Pending`` key of a PreflightValidation, apart from Nodes' (both
    are cluster-scoped names)."""
    return PREFLIGHT_PREFIX + name


def pod_key(key: str) -> str:
    """The ``Pending`` key of a pod (``<ns>/<name>``), apart from DaemonSets'."""
    return POD_PREFIX + key


# Seconds a pod that did not end gets to stop: the builder's shell ignores
# SIGTERM (it is PID 1), so this is how long its kill waits, and short.
_RUNNING_POD_GRACE: Final = 1


def _ended(pod: RawObject) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# A create's result is in flight until the cache shows the object at all.
_ABSENT = "0"
# A delete's result is in flight until the cache shows the object gone.
_GONE = str(2**63)


def _deleting(observed: RawObject) -> str:
    """The ``Pending`` part of a delete: per object (uid), not per name. An
    object made again under that name has another uid, and its delete is a
    new write, whatever ``Pending`` still holds of the last one's (the churn
    test's orphan DaemonSet, whose DELETED event had beaten the reply)."""
    uid = (observed.get("metadata") or {}).get("uid")
    return f"delete {uid}" if uid else "delete"


def _delete_options(observed: RawObject, **options: object) -> RawObject:
    """DeleteOptions guarded by the observed object's uid: a DELETE goes to
    the object the cache showed, never to another that took its name since
    (the API server answers 409), and never to one the cache did not show
    at all. A caller without an observed uid has a bug: it raises."""
    uid = (observed.get("metadata") or {}).get("uid")
    if not isinstance(uid, str) or not uid:
        name = (observed.get("metadata") or {}).get("name")
        raise ValueError(f"refusing to delete {name!r} unobserved: no uid to guard the delete")
    return {"apiVersion": "v1", "kind": "DeleteOptions", **options, "preconditions": {"uid": uid}}


def _timeless(body: object) -> object:
    """``body`` without its condition transition times."""
    if isinstance(body, dict):
        return {k: _timeless(v) for k, v in body.items() if k != "lastTransitionTime"}
    if isinstance(body, list):
        return [_timeless(item) for item in body]
    return body


def _digest(body: object) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


class Writer:
    """The operator's writes; ``pending`` is shared with the informer handlers."""

    def __init__(
        self,
        api: client.Client,
        *,
        pending: Pending | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.api = api
        self.pending = pending if pending is not None else Pending()
        self.fence = fence

    async def apply_daemonset(self, desired: RawObject, observed: RawObject | None) -> bool:
        """Server-side apply; True when it created the DaemonSet, False otherwise
        (also when skipped as already in flight)."""
        metadata = desired["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        if self.pending.in_flight(key, "apply", objects.resource_version(observed), desired):
            return False
        with self.pending.sending(key):
            reply = await self.api.send(
                "PATCH",
                resources.DAEMONSETS.path(metadata["namespace"], metadata["name"]),
                query={"fieldManager": FIELD_MANAGER, "force": True},
                body=desired,
                content_type=client.APPLY_PATCH,
                fence=self.fence,
            )
            self.pending.sent(key, "apply", desired, objects.resource_version(reply.body))
        return reply.status == 201

    async def delete_daemonset(self, observed: RawObject) -> bool:
        """Delete the DaemonSet the cache showed, guarded by its uid (never
        another of that name), background propagation (the garbage collector
        takes the pods). False when in flight, gone, or replaced: nothing to
        do."""
        metadata = observed["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        key = f"{namespace}/{name}"
        part = _deleting(observed)
        body = _delete_options(observed, propagationPolicy="Background")
        if self.pending.in_flight(key, part, objects.resource_version(observed), None):
            return False
        with self.pending.sending(key):
            try:
                await self.api.request(
                    "DELETE",
                    resources.DAEMONSETS.path(namespace, name),
                    body=body,
                    fence=self.fence,
                )
            except (errors.NotFound, errors.Conflict):
                return False  # gone already, or another object of that name now
            self.pending.sent(key, part, None, _GONE)
        return True

    async def create_device_class(self, desired: RawObject) -> bool:
        """Create; True when created, False when skipped (in flight) or when the
        name exists already (the cache will show whose it is). Raises
        ``errors.Invalid`` when the API server refuses the class."""
        key = class_key(desired["metadata"]["name"])
        if self.pending.in_flight(key, "create", _ABSENT, desired):
            return False
        with self.pending.sending(key):
            try:
                reply = await self.api.request(
                    "POST", resources.DEVICE_CLASSES.path(), body=desired, fence=self.fence
                )
            except errors.Conflict:
                return False
            self.pending.sent(key, "create", desired, objects.resource_version(reply))
        return True

    async def apply_device_class(self, desired: RawObject, observed: RawObject) -> bool:
        """Server-side apply of one of the Module's classes; False when in flight."""
        name = desired["metadata"]["name"]
        key = class_key(name)
        if self.pending.in_flight(key, "apply", objects.resource_version(observed), desired):
            return False
        with self.pending.sending(key):
            reply = await self.api.request(
                "PATCH",
                resources.DEVICE_CLASSES.path(name=name),
                query={"fieldManager": FIELD_MANAGER, "force": True},
                body=desired,
                content_type=client.APPLY_PATCH,
                fence=self.fence,
            )
            self.pending.sent(key, "apply", desired, objects.resource_version(reply))
        return True

    async def delete_device_class(self, name: str, observed: RawObject) -> bool:
        """Delete, guarded by the observed uid (never someone's class of the same name)."""
        key = class_key(name)
        part = _deleting(observed)
        body = _delete_options(observed)
        if self.pending.in_flight(key, part, objects.resource_version(observed), None):
            return False
        with self.pending.sending(key):
            try:
                await self.api.request(
                    "DELETE",
                    resources.DEVICE_CLASSES.path(name=name),
                    body=body,
                    fence=self.fence,
                )
            except (errors.NotFound, errors.Conflict):
                return False  # gone, or replaced by another object of that name
            self.pending.sent(key, part, None, _GONE)
        return True

    async def create_pod(self, desired: RawObject) -> bool:
        """Create a build or sign pod; True when created, False when skipped
        (in flight) or when the name is taken (the cache will show it)."""
        metadata = desired["metadata"]
        key = pod_key(f"{metadata['namespace']}/{metadata['name']}")
        if self.pending.in_flight(key, "create", _ABSENT, desired):
            return False
        with self.pending.sending(key):
            try:
                reply = await self.api.request(
                    "POST",
                    resources.PODS.path(metadata["namespace"]),
                    body=desired,
                    fence=self.fence,
                )
            except errors.Conflict:
                return False
            self.pending.sent(key, "create", desired, objects.resource_version(reply))
        return True

    async def dry_run_pod(self, pod: RawObject) -> None:
        """Create ``pod`` in a dry run: admission answers (Pod Security,
        quotas, the service account, the namespace), nothing is stored.
        Raises what the API server refuses."""
        await self.api.request(
            "POST",
            resources.PODS.path(pod["metadata"]["namespace"]),
            body=pod,
            query={"dryRun": "All"},
            fence=self.fence,
        )

    async def delete_pod(self, observed: RawObject) -> bool:
        """Delete a pod, guarded by its uid: one that ended without grace
        (nothing runs in it to stop), one that did not (a build or sign pod
        replaced) with a grace period of ``_RUNNING_POD_GRACE``: a pod
        deleted without grace leaves the API at once, its containers still
        running on the node until the kubelet notices, so a successor of the
        same name could start (and push) beside them. With one, the pod goes
        only once the kubelet stopped its containers."""
        metadata = observed["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        key = pod_key(f"{namespace}/{name}")
        part = _deleting(observed)
        grace = 0 if _ended(observed) else _RUNNING_POD_GRACE
        body = _delete_options(observed, gracePeriodSeconds=grace)
        if self.pending.in_flight(key, part, objects.resource_version(observed), None):
            return False
        with self.pending.sending(key):
            try:
                await self.api.request(
                    "DELETE",
                    resources.PODS.path(namespace, name),
                    body=body,
                    fence=self.fence,
                )
            except (errors.NotFound, errors.Conflict):
                return False
            self.pending.sent(key, part, None, _GONE)
        return True

    async def patch_node_labels(self, node: RawObject, change: dict[str, str | None]) -> bool:
        """Merge-patch the node's labels; False when skipped as already in flight."""
        name = node["metadata"]["name"]
        patch = {"metadata": {"labels": change}}
        if self.pending.in_flight(name, "labels", objects.resource_version(node), patch):
            return False
        await self._merge(name, "labels", resources.NODES.path(name=name), patch)
        return True

    async def patch_module_status(self, module: RawObject, patch: RawObject) -> bool:
        """Merge-patch the status; False when skipped as already in flight.

        Two reconciles in the cache gap compute the same conditions with
        different transition times (``now`` moved on): the same write, so
        the times take no part in telling whether it is in flight.
        """
        return await self._patch_module(
            module, "status", patch, subresource="status", same=_timeless(patch)
        )

    async def patch_preflight_status(self, found: RawObject, patch: RawObject) -> bool:
        """Merge-patch a PreflightValidation's status subresource; False when
        skipped as already in flight (transition times apart, as for Modules)."""
        name = found["metadata"]["name"]
        key = preflight_key(name)
        same = _timeless(patch)
        if self.pending.in_flight(key, "status", objects.resource_version(found), same):
            return False
        path = PREFLIGHTS.path(name=name, subresource="status")
        await self._merge(key, "status", path, patch, same)
        return True

    async def set_finalizers(self, module: RawObject, finalizers: list[str]) -> None:
        """Replace the finalizer list, guarded by the observed resourceVersion (409 on a race)."""
        metadata = module["metadata"]
        patch = {
            "metadata": {"finalizers": finalizers, "resourceVersion": metadata["resourceVersion"]}
        }
        await self._patch_module(module, "finalizers", patch, subresource=None)

    async def _patch_module(
        self,
        module: RawObject,
        aspect: str,
        patch: RawObject,
        *,
        subresource: str | None,
        same: object = None,
    ) -> bool:
        """Merge-patch one aspect of a Module, unless the same patch is still in
        flight; ``same`` is what identifies the write (the patch itself by default)."""
        metadata = module["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        identity = patch if same is None else same
        if self.pending.in_flight(key, aspect, objects.resource_version(module), identity):
            return False
        path = MODULES.path(metadata["namespace"], metadata["name"], subresource=subresource)
        await self._merge(key, aspect, path, patch, identity)
        return True

    async def _merge(
        self, key: str, aspect: str, path: str, patch: RawObject, identity: object = None
    ) -> None:
        """A merge patch whose object may be gone (then there is nothing to do)."""
        with self.pending.sending(key):
            try:
                written = await self.api.request(
                    "PATCH",
                    path,
                    body=patch,
                    content_type=client.MERGE_PATCH,
                    fence=self.fence,
                )
            except errors.NotFound:
                written = None  # so no result: nothing stays in flight
            remembered = patch if identity is None else identity
            self.pending.sent(key, aspect, remembered, objects.resource_version(written))

    async def create_event(self, event: RawObject) -> None:
        """Best effort: an Event that cannot be written is logged, never retried."""
        try:
            await self.api.request(
                "POST",
                resources.EVENTS.path(event["metadata"]["namespace"]),
                body=event,
                fence=self.fence,
            )
        except errors.ApiError as err:
            _log.warning("event not written: %s", err)


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
