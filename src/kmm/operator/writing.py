"""Every API write the operator makes, in one place, each skipped while the
same write is in flight.

Writes go as raw JSON (no model parsing): server-side apply of DaemonSets
(field manager ``kmm``; a create and an update are one idempotent call, so a
create repeated after a crash cannot duplicate), JSON merge patches of node
labels, Module status and finalizers, deletes (each guarded by the uid of
the object the cache showed: nothing is deleted that was never observed,
nor another object that took its name), Event creates, and pods created in
a dry run (``podadmission``: nothing stored, nothing pending).
DeviceClasses and DeviceTaintRules (cluster-scoped, in the version the
server serves) are created with a plain create (a name someone else took
must fail, not be taken over) and updated by server-side apply once they
are known to be the Module's.

Before a write, ``Writer`` asks ``inflight.Pending`` whether the same write
is still on its way to the cache, and tells it what each write returned
(its key spaces: ``inflight.pod_key``, ``class_key``, ``rule_key``,
``preflight_key``).
Reads outside the informers are ``reading``'s.

Every write carries the ``fence`` the wiring gives (the leader elector's
``holds``): a replica whose lease may have run out sends nothing more, not
even a retry of a throttled write (``kube.errors.Fenced``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from kmm.api import modules, preflight
from kmm.kube import client, errors, objects, resources
from kmm.operator import inflight

__all__ = ["FIELD_MANAGER", "MODULES", "PREFLIGHTS", "Writer"]

FIELD_MANAGER: Final = "kmm"

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]
MODULES: Final = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
PREFLIGHTS: Final = resources.Resource(
    preflight.GROUP, preflight.VERSION, preflight.PLURAL, namespaced=False
)


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


class Writer:
    """The operator's writes; ``pending`` is shared with the informer handlers."""

    def __init__(
        self,
        api: client.Client,
        *,
        pending: inflight.Pending | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.api = api
        self.pending = pending if pending is not None else inflight.Pending()
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
        key = inflight.class_key(desired["metadata"]["name"])
        return await self._create_cluster(resources.DEVICE_CLASSES, key, desired)

    async def apply_device_class(self, desired: RawObject, observed: RawObject) -> bool:
        """Server-side apply of one of the Module's classes; False when in flight."""
        key = inflight.class_key(desired["metadata"]["name"])
        return await self._apply_cluster(resources.DEVICE_CLASSES, key, desired, observed)

    async def delete_device_class(self, name: str, observed: RawObject) -> bool:
        """Delete, guarded by the observed uid (never someone's class of the same name)."""
        return await self._delete_cluster(
            resources.DEVICE_CLASSES, inflight.class_key(name), observed
        )

    async def create_taint_rule(self, resource: resources.Resource, desired: RawObject) -> bool:
        """Create a DeviceTaintRule in ``resource``'s version (the one served),
        as a DeviceClass: never taking over a name."""
        key = inflight.rule_key(desired["metadata"]["name"])
        return await self._create_cluster(resource, key, desired)

    async def apply_taint_rule(
        self, resource: resources.Resource, desired: RawObject, observed: RawObject
    ) -> bool:
        """Server-side apply of one of the Module's rules (its effect changed)."""
        key = inflight.rule_key(desired["metadata"]["name"])
        return await self._apply_cluster(resource, key, desired, observed)

    async def delete_taint_rule(self, resource: resources.Resource, observed: RawObject) -> bool:
        """Delete a rule the cache showed, guarded by its uid."""
        key = inflight.rule_key(observed["metadata"]["name"])
        return await self._delete_cluster(resource, key, observed)

    async def _create_cluster(
        self, resource: resources.Resource, key: str, desired: RawObject
    ) -> bool:
        """Create a cluster-scoped object; False when in flight or the name is taken."""
        if self.pending.in_flight(key, "create", _ABSENT, desired):
            return False
        with self.pending.sending(key):
            try:
                reply = await self.api.request(
                    "POST", resource.path(), body=desired, fence=self.fence
                )
            except errors.Conflict:
                return False
            self.pending.sent(key, "create", desired, objects.resource_version(reply))
        return True

    async def _apply_cluster(
        self, resource: resources.Resource, key: str, desired: RawObject, observed: RawObject
    ) -> bool:
        """Server-side apply of a cluster-scoped object; False when in flight."""
        name = desired["metadata"]["name"]
        if self.pending.in_flight(key, "apply", objects.resource_version(observed), desired):
            return False
        with self.pending.sending(key):
            reply = await self.api.request(
                "PATCH",
                resource.path(name=name),
                query={"fieldManager": FIELD_MANAGER, "force": True},
                body=desired,
                content_type=client.APPLY_PATCH,
                fence=self.fence,
            )
            self.pending.sent(key, "apply", desired, objects.resource_version(reply))
        return True

    async def _delete_cluster(
        self, resource: resources.Resource, key: str, observed: RawObject
    ) -> bool:
        """Delete a cluster-scoped object the cache showed, guarded by its
        uid; False when in flight, gone, or replaced by another of its name."""
        part = _deleting(observed)
        body = _delete_options(observed)
        if self.pending.in_flight(key, part, objects.resource_version(observed), None):
            return False
        with self.pending.sending(key):
            try:
                await self.api.request(
                    "DELETE",
                    resource.path(name=observed["metadata"]["name"]),
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
        key = inflight.pod_key(f"{metadata['namespace']}/{metadata['name']}")
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
        key = inflight.pod_key(f"{namespace}/{name}")
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
        key = inflight.preflight_key(name)
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
