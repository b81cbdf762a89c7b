"""HTTP exchanges with one registry host: where requests go, which
destinations are dialled, which redirects are followed, and how a failure
to get any answer reads.

``Transport.send`` is one exchange; ``Transport.exchange`` follows a
manifest's or blob's redirects (registry.k8s.io answers every manifest
request with one; Docker Hub and GHCR send blobs to a CDN), at most
``MAX_REDIRECTS`` hops. Credentials go only to the origin of the request: a
hop to another host is sent without ``Authorization``, and its 401 or 403
is the end (a challenge from it is never answered with our credentials). A
redirect to plain HTTP is followed only when the transport is ``insecure``
(the registry's ``registryTLS.insecure``, or plain HTTP): otherwise
credentials would cross the network in the clear.

``guard`` (``destinations.Guard``): every destination, the registry's, its
realm's and each redirect's, is refused when it is loopback, link-local and
the like, judged on the address actually dialled.

TLS: ``trust.context`` (the system's roots plus ``ca_files``), one context
per trust configuration, shared by every client.
``endpoint`` dials another address for ``host`` (a client outside the
network the host name is reachable in, such as an operator run beside a
sandbox): the TLS server name checked and the ``Host`` header stay
``host``'s, so the certificate must still name the registry; a redirect to
``host`` by name goes to ``endpoint`` too.

What the answer means (a challenge, a missing manifest) is the caller's:
:mod:`kmm.oci.authorizing` and :mod:`kmm.oci.client`. Limits: no redirects
followed for uploads; a body is read whole into memory.
"""

from __future__ import annotations

import dataclasses
import io
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import aiohttp
from yarl import URL

from kmm.oci import destinations, errors, trust

__all__ = ["MAX_REDIRECTS", "Answer", "Transport"]

#: Hops a manifest or blob request follows (Go's http.Client stops at 10 too).
MAX_REDIRECTS: Final = 10
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})


@dataclasses.dataclass
class Answer:
    """A registry's answer: status, headers, and body (empty for HEAD)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.host or "").lower(), url.port


class Transport:
    """Exchanges with one registry ``host`` (``host[:port]``); ``close()`` it."""

    def __init__(
        self,
        host: str,
        *,
        ca_files: Sequence[Path] = (),
        verify_tls: bool = True,
        plain_http: bool = False,
        insecure: bool = False,
        timeout: float = 300.0,
        endpoint: str | None = None,
        guard: destinations.Guard | None = None,
        on_request: Callable[[], None] | None = None,
        max_body: int | None = None,
    ) -> None:
        self.host = host
        # Bytes an answer's body may have (None: any): a registry a tenant
        # names must not make the operator read without bound.
        self._max_body = max_body
        # A realm or redirect to plain HTTP is followed only when this is set.
        self.insecure = insecure or plain_http
        self._named = URL(f"{'http' if plain_http else 'https'}://{host}")
        self._base = URL(f"{'http' if plain_http else 'https'}://{endpoint or host}")
        # Dialling ``endpoint``, the server name and Host header stay ``host``'s.
        self._server_name = URL(f"https://{host}").host if endpoint and not plain_http else None
        self._host_header = {"Host": host} if endpoint else {}
        self._endpoint = endpoint
        self._guard = guard
        self._on_request = on_request
        # The shared context of this trust (``trust.context``); False on plain HTTP.
        self.tls: ssl.SSLContext | bool = (
            False if plain_http else trust.context(ca_files, verify=verify_tls)
        )
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path_or_url: str | URL) -> URL:
        """A path (or a Location the registry gave) resolved against the registry."""
        return self._base.join(URL(path_or_url)) if isinstance(path_or_url, str) else path_or_url

    def via_endpoint(self, url: URL) -> URL:
        """``url``, dialling ``endpoint`` when it names ``host`` (a redirect
        to the registry's own name)."""
        if self._endpoint and _origin(url)[1:] == _origin(self._named)[1:]:
            return (
                url.with_scheme(self._base.scheme)
                .with_host(self._base.host or "")
                .with_port(self._base.port)
            )
        return url

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = self._guard.resolver() if self._guard is not None else None
            connector = aiohttp.TCPConnector(ssl=self.tls, resolver=resolver)
            # trust_env off: a registry on loopback is never reached through a proxy.
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def send(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        data: bytes | None,
        what: str,
        *,
        where: str,
    ) -> Answer:
        """One HTTP exchange with ``url``; ``where`` names the destination
        in public texts (the registry's host as named, or a role such as
        "its token endpoint": never an address it resolved to)."""
        # A file-like body is written in chunks (bytes are sent whole, which
        # aiohttp warns about past 1 MiB: a layer blocks the loop meanwhile);
        # a fresh one per send, since a challenge answered means sending again.
        stream = io.BytesIO(data) if data is not None else None
        same_host = url.host == self._base.host and url.port == self._base.port
        if self._guard is not None:
            try:
                self._guard.check_literal(url.host or "", url.port)
            except destinations.Refused as err:
                raise errors.DestinationRefused(
                    f"{what}: {where} is at a {err.reason} address, which is not dialled",
                    detail=str(err),
                ) from err
        if self._on_request is not None:
            self._on_request()
        try:
            async with self._session_now().request(
                method,
                url,
                headers={**self._host_header, **headers} if same_host else headers,
                data=stream,
                allow_redirects=False,
                server_hostname=self._server_name if same_host else None,
            ) as response:
                body = b"" if method == "HEAD" else await self._read(response, what, where)
                return Answer(response.status, dict(response.headers), body)
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, destinations.Refused):
                raise errors.DestinationRefused(
                    f"{what}: {where} resolves to {err.os_error.reason} addresses only, "
                    "which are not dialled",
                    detail=str(err.os_error),
                ) from err
            if isinstance(err, aiohttp.ClientConnectorCertificateError):
                raise errors.Unreachable(
                    f"{what}: the TLS certificate of {where} is not trusted", detail=str(err)
                ) from err
            if isinstance(err, aiohttp.ClientSSLError):
                raise errors.Unreachable(
                    f"{what}: the TLS handshake with {where} failed", detail=str(err)
                ) from err
            raise errors.Unreachable(f"{what}: no answer from {where}", detail=str(err)) from err
        except ssl.SSLCertVerificationError as err:
            raise errors.Unreachable(
                f"{what}: the TLS certificate of {where} is not trusted", detail=str(err)
            ) from err
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError, OSError) as err:
            # Refused, reset and timed out read alike: which one it was
            # would tell a Module's author how the operator's network
            # treats the address (a port scan).
            raise errors.Unreachable(
                f"{what}: no answer from {where}", detail=f"{type(err).__name__}: {err}"
            ) from err

    async def _read(self, response: aiohttp.ClientResponse, what: str, where: str) -> bytes:
        """The body, refused past ``max_body`` bytes (before reading more)."""
        if self._max_body is None:
            return await response.read()
        body = bytearray()
        while chunk := await response.content.read(self._max_body + 1 - len(body)):
            body += chunk
            if len(body) > self._max_body:
                raise errors.UnexpectedResponse(
                    f"{what}: {where} answered with more than {self._max_body} bytes",
                    status=response.status,
                )
        return bytes(body)

    async def exchange(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        data: bytes | None,
        what: str,
        *,
        follow: bool,
    ) -> Answer:
        """``send`` to ``url`` and, when ``follow``, to where its redirects
        lead; the last answer."""
        answer = await self.send(method, url, headers, data, what, where=self.host)
        current, hops = url, 0
        while follow and answer.status in _REDIRECTS and answer.headers.get("Location"):
            if hops == MAX_REDIRECTS:
                raise errors.UnexpectedResponse(
                    f"{what}: {self.host} redirected more than {MAX_REDIRECTS} times",
                    status=answer.status,
                )
            hops += 1
            target = self.via_endpoint(current.join(URL(answer.headers["Location"])))
            if target.scheme not in ("http", "https") or not target.host:
                raise errors.DestinationRefused(
                    f"{what}: {self.host} redirected to a URL that is not HTTP(S)",
                    detail=str(target),
                )
            if target.scheme == "http" and not self.insecure:
                raise errors.DestinationRefused(
                    f"{what}: {self.host} redirected to plain HTTP, which is followed only "
                    "for an insecure registry (registryTLS.insecure)",
                    detail=str(target),
                )
            same = _origin(target) == _origin(url)
            sent = (
                headers
                if same
                else {k: v for k, v in headers.items() if k.lower() != "authorization"}
            )
            where = self.host if same else f"the host {self.host} redirected to"
            answer = await self.send(method, target, sent, None, what, where=where)
            if not same and answer.status in (401, 403):
                # Never answer another host's challenge with our credentials.
                raise errors.UnexpectedResponse(
                    f"{what}: the host {self.host} redirected to answered {answer.status}",
                    status=answer.status,
                )
            current = target
        return answer
