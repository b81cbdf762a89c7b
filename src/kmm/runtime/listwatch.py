"""How an informer lists and watches one resource: a generic seam over the API.

`ListWatch` is two calls: `list_page` (one page of a paginated list) and
`watch` (an async iterator of raw watch events from a resourceVersion).
`ApiListWatch` implements them for any kubernetes_asyncio generated list
method: `CoreV1Api.list_node`, `AppsV1Api.list_namespaced_daemon_set` with
`("ns",)`, `CustomObjectsApi.list_namespaced_custom_object` with
`(group, version, ns, plural)`, `list_cluster_custom_object` and so on.

Responses are read as raw JSON (`_preload_content=False`): model objects would
cost memory and time the informer does not want. Watching uses
`kubernetes_asyncio.watch.Watch`, with two of its habits tamed:
- always with `timeout_seconds`, which turns off Watch's own reconnect and its
  single blind retry on 410, so the informer alone decides to resume or relist;
- a 410 arrives either as the HTTP status of the watch request (Watch raises
  on the Status body line) or as an ERROR event (Watch raises too): both
  surface as `ApiException(status=410)` and mean "relist".
With `_preload_content=False` the client does not raise on non-2xx statuses,
so `list_page` checks the status itself. `_RawWatch` skips Watch's
re-serialise-and-parse of every event into a "model" (for return type
`object` that is the same dict, parsed twice more). Every request carries a
socket read timeout, so a connection that dies silently ends in a reconnect
instead of a watch that waits forever.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal, Protocol, TypedDict

import aiohttp
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from kmm.runtime import stores

__all__ = ["ApiListWatch", "ListPage", "ListWatch", "WatchEvent", "is_gone"]


class WatchEvent(TypedDict):
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: stores.RawObject


class ListPage(TypedDict):
    items: list[stores.RawObject]
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


def is_gone(error: BaseException) -> bool:
    """410 Gone: the resourceVersion (or continue token) is too old; relist."""
    return isinstance(error, ApiException) and error.status == 410


# Margin past the server-side watch timeout before we call the socket dead.
_WATCH_READ_MARGIN = 60.0
_LIST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=30.0, sock_read=120.0)


class _RawWatch(k8s_watch.Watch):
    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        # No response type: the event keeps the parsed dict, resourceVersion
        # tracking still works (Watch reads it from the dict), no second parse.
        return super().unmarshal_event(data, None)


class ApiListWatch:
    """ListWatch over a generated list method and its leading positional args."""

    def __init__(self, method: Callable[..., Any], *args: str, kind: str | None = None) -> None:
        self._method = method
        self._args = args
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
        kwargs: dict[str, Any] = {
            "limit": limit,
            "_preload_content": False,
            "_request_timeout": _LIST_TIMEOUT,
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        if continue_token:
            kwargs["_continue"] = continue_token
        response = await self._method(*self._args, **kwargs)
        try:
            body = await response.read()
            if not 200 <= response.status <= 299:
                raise ApiException(status=response.status, reason=_reason(body))
        finally:
            response.release()
        data = json.loads(body)
        metadata = data.get("metadata") or {}
        return ListPage(
            items=data.get("items") or [],
            resource_version=metadata.get("resourceVersion", ""),
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
        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_seconds,
            "_request_timeout": aiohttp.ClientTimeout(
                sock_connect=30.0, sock_read=timeout_seconds + _WATCH_READ_MARGIN
            ),
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        async with _RawWatch(return_type="object") as stream:
            async for event in stream.stream(self._method, *self._args, **kwargs):
                if not isinstance(event, dict):
                    # Watch passes a line that is not JSON through as a string.
                    raise ApiException(status=0, reason=f"unparseable watch line: {event!r:.200}")
                yield WatchEvent(type=event["type"], object=event["raw_object"])


def _reason(body: bytes) -> str:
    try:
        status = json.loads(body)
        return f"{status.get('reason')}: {status.get('message')}"
    except ValueError:
        return body[:200].decode("utf-8", "replace")
