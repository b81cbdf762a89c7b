"""A client of one registry host over the OCI distribution API.

Authentication follows the registry's ``/v2/`` challenge, met lazily: a
request is sent anonymously first; a 401 names the scheme. Basic sends the
credentials on every later request; Bearer fetches a token from the
challenge's realm for scope ``repository:<name>:<actions>`` (with the
credentials as Basic, when there are any) and keeps it per repository.
Outcomes are typed (``errors``): credentials rejected at the challenge or the
token endpoint are ``CredentialsRejected``; a 401/403 *after* a token was
granted is ``ScopeDenied`` (Docker Hub and GHCR answer so for a repository
that does not exist); 404 is ``NotFound``. Each error's ``public`` text
holds no response body and no socket error (``errors``).

Redirects are followed for GET and HEAD of manifests and blobs
(registry.k8s.io answers every manifest request with one; Docker Hub and
GHCR send blobs to a CDN), at most ``MAX_REDIRECTS`` hops. Credentials go
only to the origin of the request: a hop to another host is sent without
``Authorization``, and its 401 or 403 is the end (a challenge from it is
never answered with our credentials). A realm or a redirect to plain HTTP
is followed only when the client is ``insecure`` (the registry's
``registryTLS.insecure``, or a plain-HTTP client): otherwise credentials or
a token would cross the network in the clear.

``guard`` (``destinations.Guard``): every destination, the registry's, its
realm's and each redirect's, is refused when it is loopback, link-local and
the like, judged on the address actually dialled.

TLS: the system's roots plus ``ca_files`` (a registry's own CA is added to,
not substituted for, the public ones, as Docker and containerd do).
``endpoint`` dials another address for ``host`` (a client outside the
network the host name is reachable in, such as an operator run beside a
sandbox): the TLS server name checked and the ``Host`` header stay
``host``'s, so the certificate must still name the registry; a redirect to
``host`` by name goes to ``endpoint`` too.

Limits: no redirects followed for uploads or by token endpoints, no chunked
or resumable uploads, no cross-repository mounts, no token refresh via
``refresh_token``.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

import aiohttp
from yarl import URL

from kmm.oci import auth, destinations, errors, mediatypes
from kmm.oci.descriptors import Descriptor, check_digest, sha256_digest

__all__ = ["MAX_REDIRECTS", "Client", "check_name", "check_reference", "ssl_context"]

# The distribution spec's repository name and tag grammars.
_NAME = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
#: Hops a manifest or blob request follows (Go's http.Client stops at 10 too).
MAX_REDIRECTS: Final = 10
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})


def check_name(name: str) -> str:
    """``name`` if it is a repository name; ValueError otherwise."""
    if not _NAME.match(name) or len(name) > 255:
        raise ValueError(
            f"{name!r} is not a repository name (lower-case path components of letters and "
            "digits, separated by '.', '_', '__' or '-')"
        )
    return name


def check_reference(reference: str) -> str:
    """``reference`` if it is a tag or a sha256 digest; ValueError otherwise."""
    if reference.startswith("sha256:"):
        return check_digest(reference)
    if not _TAG.match(reference):
        raise ValueError(f"{reference!r} is not a tag (up to 128 of [A-Za-z0-9_.-]) or a digest")
    return reference


def ssl_context(ca_files: Sequence[Path] = (), *, verify: bool = True) -> ssl.SSLContext:
    """The system's roots plus ``ca_files``; no verification when ``verify`` is
    False (a registry's ``insecureSkipTLSVerify``)."""
    if not verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context()
    for path in ca_files:
        context.load_verify_locations(cafile=str(path))
    return context


@dataclasses.dataclass
class _Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


def _error_code(body: bytes) -> tuple[str, str]:
    """The first ``errors[].code`` and message of a distribution error body
    (for logs: the public text keeps only a code of the spec's)."""
    try:
        found = json.loads(body)["errors"][0]
        return str(found.get("code", "")), str(found.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return "", body[:200].decode(errors="replace")


def _coded(status: int, code: str) -> str:
    """``status`` and, when it is one of the spec's, ``code``: "404 MANIFEST_UNKNOWN"."""
    shown = errors.public_code(code)
    return f"{status} {shown}" if shown else str(status)


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.host or "").lower(), url.port


class Client:
    """Requests to one registry ``host`` (``host[:port]``); use as an async
    context manager, or ``close()`` it."""

    def __init__(
        self,
        host: str,
        *,
        credentials: auth.Credentials | None = None,
        ca_files: Sequence[Path] = (),
        verify_tls: bool = True,
        plain_http: bool = False,
        insecure: bool = False,
        actions: Sequence[str] = ("pull", "push"),
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
        self._named = URL(f"{'http' if plain_http else 'https'}://{host}")
        self._base = URL(f"{'http' if plain_http else 'https'}://{endpoint or host}")
        # Dialling ``endpoint``, the server name and Host header stay ``host``'s.
        self._server_name = URL(f"https://{host}").host if endpoint and not plain_http else None
        self._host_header = {"Host": host} if endpoint else {}
        self._endpoint = endpoint
        self._guard = guard
        self._insecure = insecure or plain_http
        self._on_request = on_request
        self._credentials = credentials
        self._ssl: ssl.SSLContext | bool = (
            False if plain_http else ssl_context(ca_files, verify=verify_tls)
        )
        self._actions = ",".join(actions)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._basic = False  # the registry asked for Basic: send it every time
        self._tokens: dict[str, str] = {}  # repository -> bearer token

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = self._guard.resolver() if self._guard is not None else None
            connector = aiohttp.TCPConnector(ssl=self._ssl, resolver=resolver)
            # trust_env off: a registry on loopback is never reached through a proxy.
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _basic_header(self) -> str:
        assert self._credentials is not None
        pair = f"{self._credentials.username}:{self._credentials.password}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"

    def _via_endpoint(self, url: URL) -> URL:
        """``url``, dialling ``endpoint`` when it names ``host`` (a redirect
        to the registry's own name)."""
        if self._endpoint and _origin(url)[1:] == _origin(self._named)[1:]:
            return (
                url.with_scheme(self._base.scheme)
                .with_host(self._base.host or "")
                .with_port(self._base.port)
            )
        return url

    async def _send(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        data: bytes | None,
        what: str,
        *,
        where: str,
    ) -> _Answer:
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
                return _Answer(response.status, dict(response.headers), body)
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

    async def _exchange(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        data: bytes | None,
        what: str,
        *,
        follow: bool,
    ) -> _Answer:
        """``_send`` to ``url`` and, when ``follow``, to where its redirects
        lead; the last answer."""
        answer = await self._send(method, url, headers, data, what, where=self.host)
        current, hops = url, 0
        while follow and answer.status in _REDIRECTS and answer.headers.get("Location"):
            if hops == MAX_REDIRECTS:
                raise errors.UnexpectedResponse(
                    f"{what}: {self.host} redirected more than {MAX_REDIRECTS} times",
                    status=answer.status,
                )
            hops += 1
            target = self._via_endpoint(current.join(URL(answer.headers["Location"])))
            if target.scheme not in ("http", "https") or not target.host:
                raise errors.DestinationRefused(
                    f"{what}: {self.host} redirected to a URL that is not HTTP(S)",
                    detail=str(target),
                )
            if target.scheme == "http" and not self._insecure:
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
            answer = await self._send(method, target, sent, None, what, where=where)
            if not same and answer.status in (401, 403):
                # Never answer another host's challenge with our credentials.
                raise errors.UnexpectedResponse(
                    f"{what}: the host {self.host} redirected to answered {answer.status}",
                    status=answer.status,
                )
            current = target
        return answer

    async def _token(self, challenge: auth.Challenge, name: str, what: str) -> str:
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise errors.UnexpectedResponse(
                f"{what}: {self.host}'s Bearer challenge has no usable realm",
                detail=repr(realm),
                status=401,
            )
        if realm.startswith("http://") and not self._insecure:
            raise errors.DestinationRefused(
                f"{what}: {self.host}'s token endpoint is plain HTTP, which is followed only "
                "for an insecure registry (registryTLS.insecure)",
                detail=realm,
            )
        query = {"scope": f"repository:{name}:{self._actions}"} if name else {}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {"Authorization": self._basic_header()} if self._credentials else {}
        where = f"{self.host}'s token endpoint"
        url = self._via_endpoint(URL(realm).with_query(query))
        answer = await self._send("GET", url, headers, None, what, where=where)
        if answer.status in (401, 403):
            if self._credentials is None:
                raise errors.CredentialsRequired(
                    f"{what}: {where} wants credentials and none are configured for it",
                    status=answer.status,
                )
            raise errors.CredentialsRejected(
                f"{what}: {where} refused the credentials of user "
                f"{self._credentials.username!r} ({answer.status})",
                detail=realm,
                status=answer.status,
            )
        if answer.status != 200:
            code, message = _error_code(answer.body)
            raise errors.UnexpectedResponse(
                f"{what}: {where} answered {_coded(answer.status, code)}",
                detail=f"{realm}: {message}",
                status=answer.status,
                code=code,
            )
        try:
            document = json.loads(answer.body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise errors.UnexpectedResponse(
                f"{what}: {where} answered without a token", detail=realm, status=200
            )
        return token

    def _authorization(self, name: str) -> dict[str, str]:
        if name in self._tokens:
            return {"Authorization": f"Bearer {self._tokens[name]}"}
        if self._basic:
            return {"Authorization": self._basic_header()}
        return {}

    async def _request(
        self,
        method: str,
        path_or_url: str | URL,
        *,
        name: str,
        expected: tuple[int, ...],
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        follow: bool = False,
    ) -> _Answer:
        """One request, answering the registry's challenges (and following
        its redirects when ``follow``); the answer if its status is
        ``expected``, else the typed error."""
        url = self._base.join(URL(path_or_url)) if isinstance(path_or_url, str) else path_or_url
        what = f"{method} {url.path}"
        fresh_token = False
        for _ in range(3):  # anonymous, then authenticated, then a renewed token
            sent = self._authorization(name)
            answer = await self._exchange(
                method, url, {**(headers or {}), **sent}, data, what, follow=follow
            )
            if answer.status in expected:
                return answer
            code, message = _error_code(answer.body)
            coded = _coded(answer.status, code)
            if answer.status == 401:
                if "Bearer" in sent.get("Authorization", ""):
                    challenge = self._challenge(answer, what)
                    if fresh_token or challenge.params.get("error") == "insufficient_scope":
                        raise errors.ScopeDenied(
                            f"{what}: {self.host} refused the granted token ({coded})",
                            detail=f"{challenge.params.get('error', '')} {message}".strip(),
                            status=401,
                            code=code,
                        )
                    del self._tokens[name]  # expired, perhaps: fetch a new one once
                if sent.get("Authorization", "").startswith("Basic"):
                    raise errors.CredentialsRejected(
                        f"{what}: {self.host} refused the credentials of user "
                        f"{self._credentials.username if self._credentials else ''!r}",
                        detail=message,
                        status=401,
                        code=code,
                    )
                challenge = self._challenge(answer, what)
                if challenge.scheme == "basic":
                    if self._credentials is None:
                        raise errors.CredentialsRequired(
                            f"{what}: {self.host} wants credentials and none are configured for it",
                            status=401,
                        )
                    self._basic = True
                elif challenge.scheme == "bearer":
                    self._tokens[name] = await self._token(challenge, name, what)
                    fresh_token = True
                else:
                    raise errors.UnexpectedResponse(
                        f"{what}: {self.host} asks for an authentication scheme that is not "
                        "supported (Basic and Bearer are)",
                        detail=challenge.scheme,
                        status=401,
                    )
                continue
            if answer.status == 403 and sent:
                raise errors.ScopeDenied(
                    f"{what}: {self.host} denied it ({coded})",
                    detail=message,
                    status=403,
                    code=code,
                )
            if answer.status == 404:
                kind = "manifest" if "/manifests/" in url.path else "blob"
                # A HEAD answer has no body, hence no code: the path says what is missing.
                raise errors.NotFound(
                    f"{what}: {self.host} has no such {kind} ({coded})",
                    detail=message,
                    status=404,
                    code=code,
                )
            raise errors.UnexpectedResponse(
                f"{what}: {self.host} answered {coded}",
                detail=message,
                status=answer.status,
                code=code,
            )
        raise errors.ScopeDenied(f"{what}: {self.host} kept refusing a granted token", status=401)

    def _challenge(self, answer: _Answer, what: str) -> auth.Challenge:
        header = answer.headers.get("WWW-Authenticate", "")
        try:
            challenges = auth.parse_challenges(header)
        except ValueError as err:
            raise errors.UnexpectedResponse(
                f"{what}: {self.host} answered 401 without a usable challenge",
                detail=str(err),
                status=401,
            ) from err
        for challenge in challenges:
            if challenge.scheme in ("bearer", "basic"):
                return challenge
        return challenges[0]

    # The API.

    async def ping(self) -> None:
        """``GET /v2/``: the registry answers and accepts our credentials (if it
        asks for any)."""
        await self._request("GET", "/v2/", name="", expected=(200,))

    def _manifest_path(self, name: str, reference: str) -> str:
        return f"/v2/{check_name(name)}/manifests/{check_reference(reference)}"

    def _descriptor(self, answer: _Answer, what: str) -> Descriptor:
        digest = answer.headers.get("Docker-Content-Digest", "")
        if not digest and answer.body:
            digest = sha256_digest(answer.body)
        try:
            return Descriptor(
                media_type=answer.headers.get("Content-Type", "").split(";")[0].strip(),
                digest=check_digest(digest),
                size=int(answer.headers.get("Content-Length", "0") or 0),
            )
        except ValueError as err:
            # What the registry sent is the registry's: a typed answer, not a crash.
            raise errors.UnexpectedResponse(
                f"{what}: {self.host} answered {answer.status} without a usable "
                "Docker-Content-Digest or Content-Length",
                detail=str(err),
                status=answer.status,
            ) from err

    async def head_manifest(self, name: str, reference: str) -> Descriptor:
        """The manifest's descriptor (media type, digest, size); NotFound if absent."""
        path = self._manifest_path(name, reference)
        answer = await self._request(
            "HEAD",
            path,
            name=name,
            expected=(200,),
            headers={"Accept": mediatypes.ACCEPT},
            follow=True,
        )
        return self._descriptor(answer, f"HEAD {path}")

    async def exists(self, name: str, reference: str) -> Descriptor | None:
        """The manifest's descriptor, or None when it is missing: 404, or a
        granted token refused (``ScopeDenied``). Authentication errors and
        everything else raise."""
        try:
            return await self.head_manifest(name, reference)
        except (errors.NotFound, errors.ScopeDenied):
            return None

    async def get_manifest(self, name: str, reference: str) -> tuple[Descriptor, bytes]:
        path = self._manifest_path(name, reference)
        answer = await self._request(
            "GET",
            path,
            name=name,
            expected=(200,),
            headers={"Accept": mediatypes.ACCEPT},
            follow=True,
        )
        found = self._descriptor(answer, f"GET {path}")
        return dataclasses.replace(found, size=len(answer.body)), answer.body

    async def put_manifest(self, name: str, reference: str, media_type: str, body: bytes) -> str:
        """Store ``body`` under ``reference``; its digest."""
        await self._request(
            "PUT",
            self._manifest_path(name, reference),
            name=name,
            expected=(201,),
            headers={"Content-Type": media_type},
            data=body,
        )
        return sha256_digest(body)

    async def blob_exists(self, name: str, digest: str) -> bool:
        path = f"/v2/{check_name(name)}/blobs/{check_digest(digest)}"
        try:
            await self._request("HEAD", path, name=name, expected=(200,), follow=True)
        except errors.NotFound:
            return False
        return True

    async def get_blob(self, name: str, digest: str) -> bytes:
        """The blob's bytes (in memory: meant for small images), checked against ``digest``."""
        path = f"/v2/{check_name(name)}/blobs/{check_digest(digest)}"
        answer = await self._request("GET", path, name=name, expected=(200,), follow=True)
        if sha256_digest(answer.body) != digest:
            raise errors.UnexpectedResponse(
                f"GET {path}: {self.host} sent bytes of another digest",
                detail=sha256_digest(answer.body),
                status=200,
            )
        return answer.body

    async def upload_blob(self, name: str, digest: str, data: bytes) -> None:
        """A monolithic upload: POST for a session, PUT the bytes with ``?digest=``."""
        if sha256_digest(data) != check_digest(digest):
            raise ValueError(f"the data given for blob {digest} has digest {sha256_digest(data)}")
        started = await self._request(
            "POST", f"/v2/{check_name(name)}/blobs/uploads/", name=name, expected=(202,)
        )
        location = started.headers.get("Location")
        if not location:
            raise errors.UnexpectedResponse(
                f"POST /v2/{name}/blobs/uploads/: {self.host} gave no upload Location", status=202
            )
        target = self._base.join(URL(location)).update_query(digest=digest)
        await self._request(
            "PUT",
            target,
            name=name,
            expected=(201,),
            headers={"Content-Type": "application/octet-stream"},
            data=data,
        )

    async def delete_manifest(self, name: str, digest: str) -> None:
        """Delete a manifest by digest (the registry must allow deletes)."""
        path = f"/v2/{check_name(name)}/manifests/{check_digest(digest)}"
        await self._request("DELETE", path, name=name, expected=(202,))
