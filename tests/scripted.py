"""A scripted HTTP server: each request gets the next scripted answer, in order.

An answer is ``(status, body)`` or ``(status, body, headers)``, where a dict
body is sent as JSON and bytes as they are; or a ``Stream`` of watch lines.
Every request is recorded (method, path, query, headers, body). No
Kubernetes logic: statuses, Retry-After and events are what the test scripts.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import test_utils, web


@dataclasses.dataclass
class Stream:
    """A 200 watch answer: these lines (dicts as JSON, bytes raw), then the end."""

    lines: list[dict[str, Any] | bytes]
    # close: end the body cleanly; drop: abort the connection after the lines.
    end: str = "close"


@dataclasses.dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    group_headers: list[str]


Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]] | Stream


class Server:
    def __init__(self) -> None:
        self.answers: collections.deque[Answer] = collections.deque()
        self.seen: list[Seen] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._server = test_utils.TestServer(app)

    @property
    def url(self) -> str:
        return str(self._server.make_url("")).rstrip("/")

    def script(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(
            Seen(
                request.method,
                request.raw_path.split("?", 1)[0],  # as sent, %-escapes kept
                dict(request.query),
                dict(request.headers),
                await request.read(),
                request.headers.getall("Impersonate-Group", []),
            )
        )
        if not self.answers:
            return web.json_response(
                {"kind": "Status", "code": 599, "message": "unscripted"}, status=599
            )
        answer = self.answers.popleft()
        if isinstance(answer, Stream):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            response.content_type = "application/json"
            await response.prepare(request)
            for line in answer.lines:
                await response.write(
                    line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n"
                )
            if answer.end == "drop":
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write_eof()
            return response
        status, body = answer[0], answer[1]
        headers = answer[2] if len(answer) == 3 else {}  # type: ignore[misc]
        if isinstance(body, bytes):
            return web.Response(
                status=status, body=body, headers=headers, content_type="text/plain"
            )
        return web.Response(
            status=status, text=json.dumps(body), headers=headers, content_type="application/json"
        )

    async def __aenter__(self) -> Server:
        await self._server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.close()


async def running() -> AsyncIterator[Server]:
    async with Server() as server:
        yield server
