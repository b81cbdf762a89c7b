"""A scripted HTTP server speaking the API server's wire format, nothing more.

Each GET is answered from the next scripted response for its kind (list or
watch, told apart by `?watch=true`) and recorded with its query, so tests
assert what the client sent. There is no Kubernetes logic here: resource
versions, 410s and bookmarks are whatever the test scripts.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import kubeclients
from aiohttp import test_utils, web

from kmm.kube import client


@dataclasses.dataclass
class Watch:
    status: int = 200
    lines: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # close: end the chunked body cleanly (server-side timeout);
    # drop: abort the connection mid-stream; hold: stay open until released.
    end: Literal["close", "drop", "hold"] = "hold"
    # Send nothing until this is set (lets a test order events after writes).
    gate: asyncio.Event | None = None


@dataclasses.dataclass
class Request:
    path: str
    query: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.query.get("watch", "") == "true"


def obj(name: str, rv: str, *, namespace: str = "ns", **fields: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": rv}
    metadata.update(fields.pop("metadata", {}))
    return {"metadata": metadata, **fields}


def page(items: list[dict[str, Any]], rv: str, continue_token: str = "") -> dict[str, Any]:
    metadata = {"resourceVersion": rv}
    if continue_token:
        metadata["continue"] = continue_token
    return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": metadata, "items": items}


def event(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": body}


def status(code: int, reason: str = "Expired") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version",
        "reason": reason,
        "code": code,
    }


class Server:
    def __init__(self) -> None:
        self.lists: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self.watches: collections.deque[Watch] = collections.deque()
        self.requests: list[Request] = []
        self.writes: list[tuple[str, str, Any]] = []  # (method, path, body)
        self._changed = asyncio.Condition()
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._write)
        self._server = test_utils.TestServer(app)

    @property
    def url(self) -> str:
        return str(self._server.make_url("")).rstrip("/")

    def watch_requests(self) -> list[Request]:
        return [r for r in self.requests if r.watch]

    def list_requests(self) -> list[Request]:
        return [r for r in self.requests if not r.watch]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def _write(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.writes.append((request.method, request.path, body))
        async with self._changed:
            self._changed.notify_all()
        return web.json_response(body or {})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        record = Request(request.path, dict(request.query))
        self.requests.append(record)
        async with self._changed:
            self._changed.notify_all()
        if not record.watch:
            if not self.lists:
                return web.json_response(status(500, "NotScripted"), status=500)
            code, body = self.lists.popleft()
            return web.json_response(body, status=code)
        script = self.watches.popleft() if self.watches else Watch()
        if script.status != 200:
            return web.json_response(status(script.status), status=script.status)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        response.content_type = "application/json"
        await response.prepare(request)
        if script.gate is not None:
            await script.gate.wait()
        for line in script.lines:
            await response.write(json.dumps(line).encode() + b"\n")
        if script.end == "drop":
            assert request.transport is not None
            request.transport.abort()
            return response
        if script.end == "hold":
            await self._release.wait()
        await response.write_eof()
        return response

    async def __aenter__(self) -> Server:
        await self._server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        await self._server.close()


@dataclasses.dataclass
class Connection:
    server: Server
    api: client.Client


async def connect() -> AsyncIterator[Connection]:
    # One attempt per request: the informer's own backoff is under test.
    async with Server() as server, kubeclients.for_server(server.url, max_attempts=1) as api:
        yield Connection(server, api)
