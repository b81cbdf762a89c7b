"""How a cache lists and watches one resource: the ``ListWatch`` seam.

``ListWatch`` is two calls: ``list_page`` (one page of a paginated list) and
``watch`` (the raw events of one watch from a resourceVersion). ``ApiListWatch``
implements them with a ``Client`` for any ``Resource``, in one namespace or
across all; ``kube.reflecting`` drives them, and tests give the reflector a
ListWatch of their own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Literal, Protocol, TypedDict

from kmm.kube import client, errors, objects, resources

__all__ = ["ApiListWatch", "ListPage", "ListWatch", "WatchEvent"]


class WatchEvent(TypedDict):
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: objects.RawObject


class ListPage(TypedDict):
    items: list[objects.RawObject]
    resource_version: str
    continue_token: str | None


class ListWatch(Protocol):
    async def list_page(
        self,
        *,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        continue_token: str | None,
    ) -> ListPage: ...

    def watch(
        self,
        *,
        resource_version: str,
        label_selector: str | None,
        field_selector: str | None,
        timeout_seconds: int,
    ) -> AsyncGenerator[WatchEvent, None]: ...


class ApiListWatch:
    """ListWatch of ``resource`` through ``api``; ``namespace`` None means all namespaces."""

    def __init__(
        self,
        api: client.Client,
        resource: resources.Resource,
        *,
        namespace: str | None = None,
        kind: str | None = None,
    ) -> None:
        self._api = api
        self._path = resource.path(namespace)
        # Raw list items carry no kind/apiVersion; event handlers may want it.
        self.kind = kind

    async def list_page(
        self,
        *,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        continue_token: str | None,
    ) -> ListPage:
        listing = await self._api.request(
            "GET",
            self._path,
            query={
                "limit": limit or None,  # 0: everything in one answer
                "labelSelector": label_selector or None,
                "fieldSelector": field_selector or None,
                "continue": continue_token,
            },
        )
        if not isinstance(listing, dict):
            raise errors.Unavailable(0, "a list answer that is not an object", path=self._path)
        metadata = listing.get("metadata") or {}
        return ListPage(
            items=listing.get("items") or [],
            resource_version=str(metadata.get("resourceVersion") or ""),
            continue_token=metadata.get("continue") or None,
        )

    async def watch(
        self,
        *,
        resource_version: str,
        label_selector: str | None,
        field_selector: str | None,
        timeout_seconds: int,
    ) -> AsyncGenerator[WatchEvent, None]:
        events = self._api.watch(
            self._path,
            query={
                "resourceVersion": resource_version,
                "labelSelector": label_selector or None,
                "fieldSelector": field_selector or None,
            },
            timeout_seconds=timeout_seconds,
        )
        async for event in events:
            yield WatchEvent(type=event["type"], object=event["object"])
