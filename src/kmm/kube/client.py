"""The one way kmm talks to an API server: ``Client``.

- ``send(method, path, *, query, body, content_type)``: JSON in, JSON out
  (an answer that is not JSON, such as ``/healthz``'s, comes back as text),
  with the status (``Reply``); ``request`` is the same, answer only.
  Patches are requests with a patch content type (``MERGE_PATCH``,
  ``STRATEGIC_MERGE_PATCH``, ``APPLY_PATCH``, ``JSON_PATCH``); status
  subresources are paths (``Resource.path(..., subresource="status")``).
- ``watch(path, *, query, timeout_seconds)``: the events of one watch,
  bookmarks included. An ERROR event raises its error (``Gone`` for 410); a
  stream cut short, or a line that is not JSON, raises ``Unavailable``.
- A non-2xx answer raises ``errors.from_response``'s class; no answer at all
  (refused, reset, timed out) raises ``Unavailable`` with status 0.
- Retries live here and only here: a ``Throttled`` request waits for its
  Retry-After (else a backoff step) and goes again; an ``Unavailable`` GET
  is retried with backoff; a write is not retried on ``Unavailable`` (it may
  have landed: the callers' level-based loops decide); a 401 with
  credentials that can be refreshed (exec plugin, token file) is retried
  once with fresh ones. At most ``max_attempts`` attempts in all.
- A 2xx answer's ``Warning`` headers (admission policies with the Warn
  action, deprecated fields or versions) come back as ``Reply.warnings``,
  their texts unquoted, as kubectl prints them.
- ``counter`` records every request sent, and every 429 answer
  (``kube.counting``).
- A request may carry a ``fence``: asked just before each attempt is sent
  (retries included, after any wait for a slot); False means the request
  is not sent and ``errors.Fenced`` is raised. A leader's writes carry
  its lease's fence, so nothing leaves once another replica may lead.
- At most ``requests_in_flight`` requests (answer read included) run at
  once; watches are not counted, so no number of watches can starve them,
  and a request waiting to be retried holds no slot.
- ``answering`` says whether the server answered the last request that
  came back: False after one refused, cut off or answered 5xx, True after
  any other answer (a 404 or 429 is the server speaking). Readiness probes
  read it: a process whose informers cannot reach the server is not ready.
- An answer left before its end (a watch ended by an ERROR event or by its
  consumer, a read cut short) aborts its connection: its socket is closed
  before the call returns, never left to a TLS shutdown the server may not
  answer, which would outlive ``close``.

The transport is aiohttp, chosen by ``bench/bench_transport.py`` (import
memory, requests per second on the sandbox): one pooled keep-alive session
per client (``connections``: TLS and client certificate from the
kubeconfig; ``credentials``: the identity each request carries). Nothing
else in kmm imports it (import-linter). Every open TLS connection costs a
read buffer (asyncio's SSL protocol: 256 KiB, 32 KiB in the operator, which
sets ``kmm.aio.tlsbuffers``): bounding requests in flight bounds the pool to
that many connections plus one per watch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, Final, TypedDict, Unpack

import aiohttp
import multidict

from kmm.aio import backoff, clocks
from kmm.kube import connections, counting, credentials, errors, kubeconfigs

__all__ = [
    "APPLY_PATCH",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "USER_AGENT",
    "Client",
    "Options",
    "Query",
    "Reply",
    "warning_texts",
]

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
# Server-side apply takes YAML, and JSON is YAML.
APPLY_PATCH: Final = "application/apply-patch+yaml"
USER_AGENT: Final = "kmm/0.1.0"

Query = Mapping[str, str | int | bool | None]

_IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# A watch's socket may stay quiet until the server ends it; past this margin
# beyond the server-side timeout the connection is taken for dead.
_WATCH_READ_MARGIN: Final = 60.0
_MAX_RETRY_DELAY: Final = 30.0


def _params(query: Query | None) -> list[tuple[str, str]]:
    found = []
    for key, value in (query or {}).items():
        if value is None:
            continue
        found.append(
            (key, ("true" if value else "false") if isinstance(value, bool) else str(value))
        )
    return found


class Options(TypedDict, total=False):
    """What a request may carry beside its method and path."""

    query: Query | None
    body: Any
    content_type: str  # JSON unless a patch: MERGE_PATCH, APPLY_PATCH, ...
    timeout: float | None  # seconds for the whole request; the client's default
    fence: Callable[[], bool] | None  # False: do not send (errors.Fenced)


@dataclasses.dataclass(frozen=True)
class Reply:
    """A 2xx answer: its status (201 tells a create from an update), decoded body
    and the texts of its ``Warning`` headers."""

    status: int
    body: Any
    warnings: tuple[str, ...] = ()


# RFC 9111's warn-value as the API server writes it: `299 - "text"`, the text
# a quoted-string (backslash escapes a quote or a backslash).
_WARNING: Final = re.compile(r'\A\d{3} \S+ "((?:[^"\\]|\\.)*)"')
_ESCAPED: Final = re.compile(r"\\(.)")


def warning_texts(values: list[str]) -> tuple[str, ...]:
    """The texts of ``Warning`` header values; one not in that form is kept whole."""
    texts = []
    for value in values:
        found = _WARNING.match(value)
        texts.append(_ESCAPED.sub(r"\1", found.group(1)) if found else value)
    return tuple(texts)


class Client:
    """API access for one cluster identity; close it (or use ``async with``)."""

    def __init__(
        self,
        access: kubeconfigs.Access,
        *,
        timeout: float = 60.0,
        max_attempts: int = 5,
        requests_in_flight: int = 8,
        clock: clocks.Clock | None = None,
        user_agent: str = USER_AGENT,
    ) -> None:
        self.access = access
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.counter = counting.RequestCounter()
        self.answering = True  # nothing has failed yet
        self._in_flight = asyncio.Semaphore(requests_in_flight)
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        self._credentials = credentials.Credentials(access)
        self._connections = connections.Pool(access)
        self._headers: list[tuple[str, str]] = [("Accept", JSON), ("User-Agent", user_agent)]
        if access.impersonate:
            self._headers.append(("Impersonate-User", access.impersonate))
        self._headers.extend(("Impersonate-Group", group) for group in access.impersonate_groups)
        if access.impersonate_uid:
            self._headers.append(("Impersonate-Uid", access.impersonate_uid))

    @property
    def namespace(self) -> str:
        """The context's namespace (kubectl's default for namespaced requests)."""
        return self.access.namespace

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._connections.close()

    # -- the two calls -----------------------------------------------------

    async def send(self, method: str, path: str, **options: Unpack[Options]) -> Reply:
        """Send one request (retried as the module says); its status and decoded answer."""
        method = method.upper()
        response = await self._send(
            method,
            path,
            query=options.get("query"),
            body=options.get("body"),
            content_type=options.get("content_type", JSON),
            timeout=aiohttp.ClientTimeout(total=options.get("timeout") or self.timeout),
            watching=False,
            fence=options.get("fence"),
        )
        socket = connections.Socket(response)
        try:  # _attempt handed over its slot with the response
            data = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            await socket.drop()
            raise errors.Unavailable(
                0, f"answer cut short: {err!r}", method=method, path=path
            ) from err
        except asyncio.CancelledError:
            # Left mid-answer (a reconcile cancelled, a caller's timeout):
            # aiohttp closed it the TLS way; its socket must not outlive the
            # client (``connections.Socket``).
            await socket.drop()
            raise
        finally:
            response.release()  # a no-op once dropped
            self._in_flight.release()
        warnings = warning_texts(response.headers.getall("Warning", []))
        if not data:
            return Reply(response.status, None, warnings)
        if response.content_type == JSON:
            try:
                return Reply(response.status, json.loads(data), warnings)
            except ValueError as err:
                raise errors.Unavailable(
                    0, f"unreadable JSON answer: {err}", method=method, path=path
                ) from err
        return Reply(response.status, data.decode("utf-8", "replace"), warnings)

    async def request(self, method: str, path: str, **options: Unpack[Options]) -> Any:
        """``send``'s decoded answer, for the callers that need no status (most)."""
        return (await self.send(method, path, **options)).body

    async def watch(
        self, path: str, *, query: Query | None = None, timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch of ``path`` until the server ends it."""
        params: dict[str, str | int | bool | None] = {
            **(query or {}),
            "watch": True,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
        }
        response = await self._send(
            "GET",
            path,
            query=params,
            body=None,
            content_type=JSON,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=30.0, sock_read=timeout_seconds + _WATCH_READ_MARGIN
            ),
            watching=True,
        )
        socket = connections.Socket(response)
        buffer = bytearray()
        scanned = 0  # no newline before this offset of the buffer
        read_to_end = False
        try:
            # Lines are split here rather than by aiohttp's readline, whose
            # 64 KiB line limit a large object would exceed.
            async for chunk in response.content.iter_any():
                buffer += chunk
                start = 0
                while (end := buffer.find(b"\n", max(start, scanned))) >= 0:
                    line = bytes(buffer[start:end])
                    start, scanned = end + 1, 0
                    if line.strip():
                        yield _event(line, path)
                del buffer[:start]
                scanned = len(buffer)
            read_to_end = True
            if buffer.strip():
                raise errors.Unavailable(
                    0, "watch stream ended inside an event", method="GET", path=path
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise errors.Unavailable(
                0, f"watch stream cut: {err!r}", method="GET", path=path
            ) from err
        finally:
            # Left before its end: an ERROR event, a cut, a consumer that stopped.
            if read_to_end:
                response.release()
            else:
                await socket.drop()

    # -- sending, retrying -------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Query | None,
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
        watching: bool,
        fence: Callable[[], bool] | None = None,
    ) -> aiohttp.ClientResponse:
        delays = backoff.Backoff(initial=0.5, maximum=_MAX_RETRY_DELAY)
        refreshed = False
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._attempt(
                    method,
                    path,
                    query=query,
                    body=body,
                    content_type=content_type,
                    timeout=timeout,
                    watching=watching,
                    fence=fence,
                )
            except errors.Throttled as err:
                if attempt >= self.max_attempts:
                    raise
                delay = err.retry_after if err.retry_after is not None else delays.next()
            except errors.Unavailable:
                if method not in _IDEMPOTENT or attempt >= self.max_attempts:
                    raise
                delay = delays.next()
            except errors.Unauthorized:
                if refreshed or not self._credentials.refreshable or attempt >= self.max_attempts:
                    raise
                self._credentials.invalidate()
                refreshed, delay = True, 0.0
            await self._clock.sleep(min(delay, _MAX_RETRY_DELAY))

    async def _attempt(
        self,
        method: str,
        path: str,
        *,
        query: Query | None,
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
        watching: bool,
        fence: Callable[[], bool] | None,
    ) -> aiohttp.ClientResponse:
        session = await self._connections.session(await self._credentials.certificate())
        # Pairs, not a dict: Impersonate-Group repeats, one header per group.
        headers = multidict.CIMultiDict(self._headers)
        authorization = await self._credentials.authorization()
        if authorization is not None:
            headers["Authorization"] = authorization
        data: bytes | None = None
        if body is not None:
            data = (
                body
                if isinstance(body, bytes)
                else json.dumps(body, separators=(",", ":")).encode()
            )
            headers["Content-Type"] = content_type
        # A request holds a slot from here until its answer is read (the
        # caller releases it on success); a wait between retries holds none.
        if not watching:
            await self._in_flight.acquire()
        handed_over = False
        try:
            # Asked last, after every wait: the request goes out now or never.
            if fence is not None and not fence():
                raise errors.Fenced(method, path)
            self.counter.record("WATCH" if watching else method, path)
            try:
                response = await session.request(
                    method,
                    self.access.server + path,
                    params=_params(query),
                    data=data,
                    headers=headers,
                    timeout=timeout,
                    proxy=self.access.proxy_url,
                    server_hostname=self.access.tls_server_name,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                self.answering = False
                raise errors.Unavailable(
                    0, f"{type(err).__name__}: {err}", method=method, path=path
                ) from err
            self.answering = response.status < 500
            if response.status == 429:
                self.counter.record_throttled("WATCH" if watching else method, path)
            if 200 <= response.status < 300:
                handed_over = not watching
                return response
            socket = connections.Socket(response)
            try:
                answer = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                answer = b""
                await socket.drop()
            except asyncio.CancelledError:
                await socket.drop()
                raise
            finally:
                response.release()  # a no-op once dropped
        finally:
            if not watching and not handed_over:
                self._in_flight.release()
        raise errors.from_response(
            response.status, answer, method=method, path=path, headers=response.headers
        )


def _event(line: bytes, path: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as err:
        raise errors.Unavailable(
            0, f"unreadable watch event: {line[:200]!r}", method="GET", path=path
        ) from err
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise errors.Unavailable(0, f"not a watch event: {line[:200]!r}", method="GET", path=path)
    if event.get("type") == "ERROR":
        status = event["object"]
        code = status.get("code")
        raise errors.from_response(
            code if isinstance(code, int) else 0, status, method="GET", path=path
        )
    return event
