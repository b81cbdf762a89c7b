"""Event handlers that turn informer events into work-queue keys.

A controller watches its primary resource and the resources it owns or
depends on; each event maps to the keys of the primary objects to look at
again (level-based: the event's content does not matter, only which keys).
These builders cover the usual mappings, like controller-runtime's
`EnqueueRequestForObject` / `EnqueueRequestForOwner` / `EnqueueRequestsFromMapFunc`.
`enqueue` is usually `controllers.Controller.enqueue`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kmm.runtime import informers, stores

__all__ = ["enqueue_mapped", "enqueue_object", "enqueue_owner"]

Enqueue = Callable[[str], None]


def enqueue_object(enqueue: Enqueue) -> informers.FuncHandler:
    """The object's own key."""
    return informers.FuncHandler.each(lambda obj: enqueue(stores.key_of(obj)))


def enqueue_owner(
    enqueue: Enqueue, *, kind: str, api_version: str | None = None
) -> informers.FuncHandler:
    """The key of the object's controller owner of `kind` (same namespace)."""

    def owner_keys(obj: stores.RawObject) -> Iterable[str]:
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace")
        for ref in metadata.get("ownerReferences") or ():
            if not ref.get("controller") or ref.get("kind") != kind:
                continue
            if api_version is not None and ref.get("apiVersion") != api_version:
                continue
            yield f"{namespace}/{ref['name']}" if namespace else ref["name"]

    return enqueue_mapped(enqueue, owner_keys)


def enqueue_mapped(
    enqueue: Enqueue, mapping: Callable[[stores.RawObject], Iterable[str]]
) -> informers.FuncHandler:
    """Keys computed from the object; on update, from both old and new state,
    so an object that stops matching (a node relabelled) still triggers the
    primary it used to belong to."""

    def each(obj: stores.RawObject) -> None:
        for key in mapping(obj):
            enqueue(key)

    def update(old: stores.RawObject, new: stores.RawObject) -> None:
        for key in {*mapping(old), *mapping(new)}:
            enqueue(key)

    return informers.FuncHandler(add=each, update=update, delete=each)
