"""A wire-level fake of the two resource.k8s.io/v1 endpoints the plugin uses.

An aiohttp server that stores ResourceSlices and ResourceClaims, supports
list (with the fieldSelector the publisher sends), create with
generateName, delete, get and watch, counts every request by verb and can
be told to fail the next N requests with a status.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import kubeclients
from aiohttp import web
from aiohttp.test_utils import TestServer

from kmm.kube import client

BASE = "/apis/resource.k8s.io/v1"


class FakeAPI:
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: Counter[str] = Counter()
        self.nodes: dict[str, str] = {"node-a": "uid-of-node-a"}
        self.fail_next: list[int] = []
        self._rv = itertools.count(100)
        self._names = itertools.count()
        self._watchers: list[asyncio.Queue[dict[str, Any] | None]] = []
        app = web.Application()
        app.router.add_get(f"{BASE}/resourceslices", self._list_slices)
        app.router.add_post(f"{BASE}/resourceslices", self._create_slice)
        app.router.add_delete(f"{BASE}/resourceslices/{{name}}", self._delete_slice)
        app.router.add_get(f"{BASE}/resourceclaims", self._list_claims)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_get(f"{BASE}/namespaces/{{ns}}/resourceclaims/{{name}}", self._get_claim)
        self.server = TestServer(app)

    @property
    def writes(self) -> int:
        return self.requests["POST"] + self.requests["PUT"] + self.requests["DELETE"]

    def _count(self, request: web.Request) -> web.Response | None:
        verb = "WATCH" if request.query.get("watch") else request.method
        self.requests[verb] += 1
        if self.fail_next:
            status = self.fail_next.pop(0)
            return web.json_response({"kind": "Status", "message": "injected"}, status=status)
        return None

    async def _list_slices(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        wanted = dict(
            part.split("=", 1) for part in request.query.get("fieldSelector", "").split(",") if part
        )
        items = [
            s
            for s in self.slices.values()
            if all(s["spec"][key.removeprefix("spec.")] == value for key, value in wanted.items())
        ]
        return web.json_response({"items": items, "metadata": {"resourceVersion": "1"}})

    async def _create_slice(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        body = await request.json()
        meta = body["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{next(self._names):05d}"
        meta["name"] = name
        meta["resourceVersion"] = str(next(self._rv))
        # the API server adds defaults; the publisher must not mistake them for changes
        for device in body["spec"].get("devices", []):
            device.setdefault("allowMultipleAllocations", False)
        self.slices[name] = body
        return web.json_response(body, status=201)

    async def _delete_slice(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        gone = self.slices.pop(request.match_info["name"], None)
        if gone is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response({"kind": "Status", "status": "Success"})

    def put_claim(self, claim: dict[str, Any], *, notify: bool = True) -> None:
        claim["metadata"]["resourceVersion"] = str(next(self._rv))
        key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
        kind = "MODIFIED" if key in self.claims else "ADDED"
        self.claims[key] = claim
        if notify:
            for queue in self._watchers:
                queue.put_nowait({"type": kind, "object": claim})

    async def _list_claims(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        if request.query.get("watch"):
            return await self._watch(request)
        return web.json_response(
            {"items": list(self.claims.values()), "metadata": {"resourceVersion": "99"}}
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers.append(queue)
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while (event := await queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self._watchers.remove(queue)
        return response

    async def wait_for_watch(self) -> None:
        for _ in range(2000):
            if self._watchers:
                return
            await asyncio.sleep(0.005)
        raise AssertionError("nobody started a watch")

    def end_watches(self) -> None:
        for queue in self._watchers:
            queue.put_nowait(None)

    async def _get_node(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        name = request.match_info["name"]
        if name not in self.nodes:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response({"metadata": {"name": name, "uid": self.nodes[name]}})

    async def _get_claim(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._count(request)) is not None:
            return failed
        claim = self.claims.get((request.match_info["ns"], request.match_info["name"]))
        if claim is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response(claim)


async def started(fake: FakeAPI) -> AsyncIterator[client.Client]:
    await fake.server.start_server()
    # One attempt: the tests script failures for the library's own retries.
    api = kubeclients.for_server(str(fake.server.make_url("")), max_attempts=1)
    try:
        yield api
    finally:
        fake.end_watches()
        await api.close()
        await fake.server.close()
