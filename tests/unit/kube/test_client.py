"""``kube.client.Client`` on the wire: the error tree, retries, watches, counting.

Against a scripted HTTP server (``scripted``): what the client sends and how
it reads each answer, nothing of Kubernetes' semantics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils, web
from scripted import Seen, Server, Stream

from kmm.kube import client, errors, kubeconfigs, resources

NOT_FOUND = {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'nodes "x" not found'}


class InstantClock:
    """A clock whose sleeps return at once and are recorded."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def now(self) -> float:
        return 0.0

    def call_at(self, when: float, callback: Callable[[], None]) -> Any:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with Server() as running:
        yield running


def make(server: Server, clock: InstantClock | None = None, **access: Any) -> client.Client:
    return client.Client(
        kubeconfigs.Access(server=server.url, source="test", **access),
        clock=clock or InstantClock(),
    )


def status(code: int, reason: str, message: str = "m", **extra: Any) -> dict[str, Any]:
    return {"kind": "Status", "code": code, "reason": reason, "message": message, **extra}


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (400, "BadRequest", errors.Invalid),
        (401, "Unauthorized", errors.Unauthorized),
        (403, "Forbidden", errors.Forbidden),
        (404, "NotFound", errors.NotFound),
        (409, "Conflict", errors.Conflict),
        (410, "Expired", errors.Gone),
        (422, "Invalid", errors.Invalid),
        (405, "MethodNotAllowed", errors.ApiError),
    ],
)
async def test_each_status_raises_its_class(
    server: Server, code: int, reason: str, kind: type[errors.ApiError]
) -> None:
    server.script((code, status(code, reason, "the message")))
    async with make(server) as api:
        with pytest.raises(kind) as raised:
            await api.request("PUT", "/api/v1/nodes/x", body={})
    error = raised.value
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (code, reason, "the message")
    assert (error.method, error.path) == ("PUT", "/api/v1/nodes/x")
    assert not error.retriable
    assert len(server.seen) == 1  # none of these is retried


async def test_invalid_names_the_fields(server: Server) -> None:
    causes = [{"field": "spec.selector", "reason": "FieldValueRequired", "message": "Required"}]
    server.script((422, status(422, "Invalid", details={"causes": causes})))
    async with make(server) as api:
        with pytest.raises(errors.Invalid) as raised:
            await api.request("POST", "/api/v1/namespaces/ns/pods", body={})
    assert raised.value.causes == (errors.Cause("spec.selector", "FieldValueRequired", "Required"),)


async def test_already_exists_is_a_conflict_that_says_so(server: Server) -> None:
    server.script((409, status(409, "AlreadyExists")), (409, status(409, "Conflict")))
    async with make(server) as api:
        with pytest.raises(errors.Conflict) as first:
            await api.request("POST", "/api/v1/nodes", body={})
        with pytest.raises(errors.Conflict) as second:
            await api.request("PUT", "/api/v1/nodes/x", body={})
    assert first.value.already_exists
    assert not second.value.already_exists


async def test_a_body_that_is_not_a_status_is_kept_as_the_message(server: Server) -> None:
    server.script((502, b"<html>bad gateway</html>"))
    async with make(server) as api:
        with pytest.raises(errors.Unavailable) as raised:
            await api.request("DELETE", "/api/v1/nodes/x")
    assert raised.value.status == 502
    assert "bad gateway" in raised.value.message


async def test_throttled_waits_for_retry_after_then_succeeds(server: Server) -> None:
    clock = InstantClock()
    server.script(
        (429, status(429, "TooManyRequests"), {"Retry-After": "3"}),
        (429, status(429, "TooManyRequests")),
        (200, {"ok": True}),
    )
    async with make(server, clock) as api:
        # A write too: a 429 means the server did not process the request.
        assert await api.request("PATCH", "/api/v1/nodes/x", body={}) == {"ok": True}
    assert clock.sleeps[0] == 3.0
    assert 0 < clock.sleeps[1] <= 0.5  # no Retry-After: the first backoff step
    assert [s.method for s in server.seen] == ["PATCH"] * 3
    assert api.counter.writes == {("PATCH", "nodes"): 3}
    assert api.counter.throttled == {("PATCH", "nodes"): 2}


async def test_throttled_past_max_attempts_raises_with_retry_after(server: Server) -> None:
    answer = (429, status(429, "TooManyRequests"), {"Retry-After": "1"})
    server.script(*[answer] * 5)
    async with make(server) as api:
        with pytest.raises(errors.Throttled) as raised:
            await api.request("GET", "/api/v1/nodes")
    assert raised.value.retry_after == 1.0
    assert raised.value.retriable
    assert len(server.seen) == 5


async def test_unavailable_read_is_retried_a_write_is_not(server: Server) -> None:
    clock = InstantClock()
    server.script((503, status(503, "ServiceUnavailable")), (500, b"oops"), (200, {"items": []}))
    async with make(server, clock) as api:
        assert await api.request("GET", "/api/v1/nodes") == {"items": []}
        assert len(clock.sleeps) == 2
        server.script((503, status(503, "ServiceUnavailable")))
        with pytest.raises(errors.Unavailable):
            await api.request("POST", "/api/v1/nodes", body={})
    assert [s.method for s in server.seen] == ["GET", "GET", "GET", "POST"]


async def test_no_answer_at_all_is_unavailable_status_zero() -> None:
    access = kubeconfigs.Access(server="http://127.0.0.1:9", source="nothing listens")
    clock = InstantClock()
    async with client.Client(access, clock=clock, max_attempts=2) as api:
        with pytest.raises(errors.Unavailable) as raised:
            await api.request("GET", "/version")
    assert raised.value.status == 0
    assert raised.value.retriable
    assert len(clock.sleeps) == 1
    assert api.answering is False


async def test_answering_follows_the_last_answer(server: Server) -> None:
    server.script(
        (500, b"oops"),
        (404, NOT_FOUND),
        (503, status(503, "ServiceUnavailable")),
        (429, status(429, "TooManyRequests")),
        (200, {"ok": True}),
    )
    seen = []
    async with client.Client(
        kubeconfigs.Access(server=server.url, source="test"), max_attempts=1
    ) as api:
        assert api.answering is True
        for _ in range(5):
            with contextlib.suppress(errors.ApiError):
                await api.request("GET", "/api/v1/nodes/x")
            seen.append(api.answering)
    # A 404 or a 429 is the server speaking; a 5xx is not an answer to work from.
    assert seen == [False, True, False, True, True]


async def test_unauthorized_with_a_rotated_token_file_is_retried_once(
    server: Server, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    async with make(server, token_file=token) as api:
        server.script((200, {}))
        await api.request("GET", "/version")
        token.write_text("new\n")  # rotated; the client would read it within a minute
        server.script((401, status(401, "Unauthorized")), (200, {"v": 1}))
        assert await api.request("GET", "/version") == {"v": 1}
        server.script((401, status(401, "Unauthorized")), (401, status(401, "Unauthorized")))
        with pytest.raises(errors.Unauthorized):
            await api.request("GET", "/version")
    assert [s.headers["Authorization"] for s in server.seen] == [
        "Bearer old",
        "Bearer old",
        "Bearer new",
        "Bearer new",
        "Bearer new",
    ]


async def test_a_static_token_is_not_retried_on_401(server: Server) -> None:
    server.script((401, status(401, "Unauthorized")))
    async with make(server, token="t") as api:
        with pytest.raises(errors.Unauthorized):
            await api.request("GET", "/version")
    assert len(server.seen) == 1


async def test_send_tells_create_from_update_and_request_decodes(server: Server) -> None:
    server.script((201, {"metadata": {"resourceVersion": "5"}}), (200, b"ok"), (200, {}))
    async with make(server) as api:
        reply = await api.send(
            "PATCH",
            "/apis/apps/v1/namespaces/ns/daemonsets/d",
            query={"fieldManager": "kmm", "force": True, "dryRun": None},
            body={"kind": "DaemonSet"},
            content_type=client.APPLY_PATCH,
        )
        assert (reply.status, reply.body) == (201, {"metadata": {"resourceVersion": "5"}})
        assert await api.request("GET", "/healthz") == "ok"
        await api.request(
            "PATCH", resources.NODES.path(name="a/../b"), body={}, content_type=client.MERGE_PATCH
        )
    sent: Seen = server.seen[0]
    assert sent.query == {"fieldManager": "kmm", "force": "true"}
    assert sent.headers["Content-Type"] == "application/apply-patch+yaml"
    assert sent.body == b'{"kind":"DaemonSet"}'
    assert sent.headers["User-Agent"] == client.USER_AGENT
    assert server.seen[2].headers["Content-Type"] == "application/merge-patch+json"
    # A name never leaves its path segment.
    assert server.seen[2].path == "/api/v1/nodes/a%2F..%2Fb"


async def test_counter_counts_every_request_and_writes_apart(server: Server) -> None:
    server.script(*[(200, {})] * 6)
    async with make(server) as api:
        await api.request("GET", "/api/v1/namespaces/ns/configmaps/x")
        await api.request("POST", "/api/v1/namespaces/ns/configmaps", body={})
        await api.request("PATCH", "/api/v1/nodes/n1", body={}, content_type=client.MERGE_PATCH)
        await api.request("PATCH", "/api/v1/nodes/n1/status", body={})
        await api.request("DELETE", "/api/v1/namespaces/ns/configmaps/x")
        await api.request("GET", "/apis/apps/v1/daemonsets", query={"dryRun": "All"})
    assert api.counter.writes == {
        ("POST", "configmaps"): 1,
        ("PATCH", "nodes"): 1,
        ("PATCH", "nodes/status"): 1,
        ("DELETE", "configmaps"): 1,
    }
    assert api.counter.total == 6
    assert api.counter.total_writes == 4
    assert api.counter.by_verb("GET") == 2
    assert api.counter.writes_to("configmaps") == 2


def _event(kind: str, name: str, rv: str) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}


async def _collect(
    api: client.Client, into: list[dict[str, Any]] | None = None, **query: Any
) -> list[dict[str, Any]]:
    events = [] if into is None else into
    async for event in api.watch("/api/v1/nodes", query=query, timeout_seconds=9):
        events.append(event)
    return events


async def test_watch_yields_events_and_bookmarks_until_the_server_ends_it(server: Server) -> None:
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}
    big = _event("ADDED", "b", "6")
    big["object"]["spec"] = {"padding": "x" * 200_000}  # past aiohttp's 64 KiB readline
    server.script(Stream([_event("ADDED", "a", "5"), big, bookmark]))
    async with make(server) as api:
        events = await _collect(api, resourceVersion="4")
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert len(events[1]["object"]["spec"]["padding"]) == 200_000
    query = server.seen[0].query
    assert query == {
        "resourceVersion": "4",
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "9",
    }
    assert api.counter.requests == {("WATCH", "nodes"): 1}


async def test_watch_error_event_410_is_gone(server: Server) -> None:
    expired = {"type": "ERROR", "object": status(410, "Expired", "too old resource version")}
    server.script(Stream([_event("ADDED", "a", "5"), expired]))
    async with make(server) as api:
        seen: list[dict[str, Any]] = []
        with pytest.raises(errors.Gone) as raised:
            await _collect(api, seen)
    assert len(seen) == 1
    assert raised.value.message == "too old resource version"


async def test_watch_answered_410_is_gone_and_not_retried(server: Server) -> None:
    server.script((410, status(410, "Expired")))
    async with make(server) as api:
        with pytest.raises(errors.Gone):
            await _collect(api)
    assert len(server.seen) == 1


async def test_watch_cut_mid_stream_is_unavailable(server: Server) -> None:
    server.script(Stream([_event("ADDED", "a", "5"), b'{"type": "MODIFIED", "obj'], end="drop"))
    async with make(server) as api:
        seen: list[dict[str, Any]] = []
        with pytest.raises(errors.Unavailable) as raised:
            await _collect(api, seen)
    assert len(seen) == 1
    assert raised.value.status == 0


async def test_watch_line_that_is_not_an_event_is_unavailable(server: Server) -> None:
    server.script(Stream([b"this is not json\n"]))
    async with make(server) as api:
        with pytest.raises(errors.Unavailable, match="unreadable watch event"):
            await _collect(api)


async def test_impersonation_headers_one_per_group(server: Server) -> None:
    server.script((200, {}))
    api = make(server, impersonate="system:serviceaccount:ns:sa", impersonate_groups=("a", "b"))
    async with api:
        await api.request("GET", "/api/v1/secrets")
    request = server.seen[0]
    assert request.headers["Impersonate-User"] == "system:serviceaccount:ns:sa"
    assert request.group_headers == ["a", "b"]  # one header per group, as the server reads them


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/ns/configmaps", "configmaps"),
        ("/api/v1/namespaces/ns/configmaps/x", "configmaps"),
        ("/api/v1/nodes/n1/status", "nodes/status"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/apis/apps/v1/namespaces/ns/daemonsets/d?dryRun=All", "apps/daemonsets"),
        ("/apis/resource.k8s.io/v1/deviceclasses/c", "resource.k8s.io/deviceclasses"),
    ],
)
def test_resource_of(path: str, resource: str) -> None:
    from kmm.kube import counting

    assert counting.resource_of(path) == resource


async def test_requests_in_flight_are_bounded_and_watches_do_not_count() -> None:
    """Requests wait for a slot (answer read included); open watches take none."""
    active, peak, release = 0, 0, asyncio.Event()
    watching = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal active, peak, watching
        if request.query.get("watch"):
            watching += 1
            response = web.StreamResponse()
            await response.prepare(request)
            await release.wait()
            return response
        active += 1
        peak = max(peak, active)
        try:
            await release.wait()
            return web.json_response({"kind": "Node"})
        finally:
            active -= 1

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    async with test_utils.TestServer(app) as http:
        access = kubeconfigs.Access(server=str(http.make_url("")).rstrip("/"), source="test")
        async with client.Client(access, requests_in_flight=2) as api:

            async def drain(path: str) -> None:
                async for _ in api.watch(path, timeout_seconds=30):
                    pass

            watches = [asyncio.create_task(drain(f"/api/v1/nodes?w={i}")) for i in range(3)]
            gets = [
                asyncio.create_task(api.request("GET", f"/api/v1/nodes/n{i}")) for i in range(5)
            ]
            for _ in range(500):  # bounded wait for the server to hold what it can get
                if watching == 3 and active == 2:
                    break
                await asyncio.sleep(0.01)
            assert (watching, active) == (3, 2)
            await asyncio.sleep(0.05)  # a third request would have arrived by now
            assert peak == 2
            release.set()
            assert [answer["kind"] for answer in await asyncio.gather(*gets)] == ["Node"] * 5
            await asyncio.gather(*watches)
    assert peak == 2


async def test_a_request_waiting_to_retry_holds_no_slot(server: Server) -> None:
    class HeldClock(InstantClock):
        def __init__(self) -> None:
            super().__init__()
            self.waiting, self.go = asyncio.Event(), asyncio.Event()

        async def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            self.waiting.set()
            await self.go.wait()

    clock = HeldClock()
    server.script(
        (429, status(429, "TooManyRequests"), {"Retry-After": "3"}),
        (200, {"kind": "Node", "metadata": {"name": "b"}}),
        (200, {"kind": "Node", "metadata": {"name": "a"}}),
    )
    access = kubeconfigs.Access(server=server.url, source="test")
    async with client.Client(access, clock=clock, requests_in_flight=1) as api:
        first = asyncio.create_task(api.request("GET", "/api/v1/nodes/a"))
        await asyncio.wait_for(clock.waiting.wait(), 10)  # throttled, waiting to retry
        second = await asyncio.wait_for(api.request("GET", "/api/v1/nodes/b"), 10)
        assert second["metadata"]["name"] == "b"
        clock.go.set()
        assert (await first)["metadata"]["name"] == "a"
    assert clock.sleeps == [3.0]


async def test_a_fence_is_asked_before_every_attempt_and_stops_a_retry(server: Server) -> None:
    clock = InstantClock()
    server.script(
        (429, status(429, "TooManyRequests"), {"Retry-After": "1"}),
        (200, {"ok": True}),
    )
    asked: list[bool] = []
    allowed = [True, False]  # the lease runs out while the first 429 is waited out

    def fence() -> bool:
        asked.append(allowed[len(asked)])
        return asked[-1]

    async with make(server, clock) as api:
        with pytest.raises(errors.Fenced) as raised:
            await api.request("PATCH", "/api/v1/nodes/x", body={}, fence=fence)
        assert "PATCH /api/v1/nodes/x" in str(raised.value)
        # One attempt went out, was throttled; the retry was never sent.
        assert [s.method for s in server.seen] == ["PATCH"]
        assert api.counter.writes == {("PATCH", "nodes"): 1}
        assert api.counter.throttled == {("PATCH", "nodes"): 1}
        assert clock.sleeps == [1.0]
        # Not a retriable API error: the caller must not send it again blindly.
        assert not isinstance(raised.value, errors.ApiError)
        assert await api.request("GET", "/api/v1/nodes/x", fence=lambda: True) == {"ok": True}


async def test_warning_headers_come_back_unquoted_with_the_reply(server: Server) -> None:
    server.script(
        (200, {"kind": "Module"}, {"Warning": r'299 - "spec.x: say \"no\" \\ twice"'}),
        (200, {"kind": "Module"}),
    )
    async with make(server) as api:
        warned = await api.send("PATCH", "/apis/g/v1/modules/m", body={})
        quiet = await api.send("GET", "/apis/g/v1/modules/m")
    assert warned.warnings == ('spec.x: say "no" \\ twice',)
    assert quiet.warnings == ()


def test_warning_texts_keep_a_value_not_in_warn_value_form() -> None:
    assert client.warning_texts(['299 - "a"', "free text", '199 agent "b c"']) == (
        "a",
        "free text",
        "b c",
    )
