"""A thin raw-JSON client over a ``kubernetes_asyncio`` ``ApiClient``.

The plugin speaks to two resources (ResourceClaims, ResourceSlices) and
wants their JSON as it is on the wire (``TypedDict`` payloads), not the
generated model classes; it also counts every request so tests and the
benchmark can check "zero API calls per prepare with a warm cache". The
``ApiClient`` brings kubeconfig / in-cluster authentication.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s

from kmm.kubeletplugin import errors

__all__ = ["KubeAPI"]

RESOURCE_API = "/apis/resource.k8s.io/v1"


class KubeAPI:
    """JSON requests against the API server, with a request counter."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api = api_client
        self.requests = 0
        self.requests_by_verb: dict[str, int] = {}

    def _count(self, verb: str) -> None:
        self.requests += 1
        self.requests_by_verb[verb] = self.requests_by_verb.get(verb, 0) + 1

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        timeout: float | None,
    ) -> aiohttp.ClientResponse:
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise errors.KubeAPIError(
                0, str(err) or type(err).__name__, method=method, path=path
            ) from err
        if not 200 <= response.status < 300:
            text = await response.text()
            response.release()
            reason = _status_message(text)
            raise errors.KubeAPIError(response.status, reason, method=method, path=path)
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = 30.0,
    ) -> Any:
        """Send one request and return the decoded JSON body."""
        verb = "WATCH" if (query or {}).get("watch") else method
        self._count(verb)
        response = await self._send(method, path, query=query, body=body, timeout=timeout)
        try:
            return await response.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as err:
            raise errors.KubeAPIError(
                0, f"bad response body: {err}", method=method, path=path
            ) from err
        finally:
            response.release()

    async def watch(self, path: str, *, query: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Yield the events of a watch request until the server ends it."""
        self._count("WATCH")
        params = {**query, "watch": "true", "allowWatchBookmarks": "true"}
        response = await self._send("GET", path, query=params, body=None, timeout=None)
        try:
            async for line in response.content:
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            # A broken or timed-out stream is routine: the informer re-lists.
            raise errors.KubeAPIError(0, f"watch broken: {err!r}", method="GET", path=path) from err
        finally:
            response.release()


def _status_message(text: str) -> str:
    """The ``message`` of a ``Status`` body, or the body itself."""
    try:
        status = json.loads(text)
    except ValueError:
        return text
    if isinstance(status, dict):
        return str(status.get("message", text))
    return text
