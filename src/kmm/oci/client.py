"""A client of one registry host over the OCI distribution API.

Authentication follows the registry's ``/v2/`` challenge, met lazily: a
request is sent anonymously first; a 401 names the scheme. Basic sends the
credentials on every later request; Bearer fetches a token from the
challenge's realm for scope ``repository:<name>:<actions>`` (with the
credentials as Basic, when there are any) and keeps it per repository.
Outcomes are typed (``errors``): credentials rejected at the challenge or the
token endpoint are ``CredentialsRejected``; a 401/403 *after* a token was
granted is ``ScopeDenied`` (Docker Hub and GHCR answer so for a repository
that does not exist); 404 is ``NotFound``.

TLS: the system's roots plus ``ca_files`` (a registry's own CA is added to,
not substituted for, the public ones, as Docker and containerd do).
``endpoint`` dials another address for ``host`` (a client outside the
network the host name is reachable in, such as an operator run beside a
sandbox): the TLS server name checked and the ``Host`` header stay
``host``'s, so the certificate must still name the registry.

Limits: no redirects followed for uploads, no chunked or resumable uploads,
no cross-repository mounts, no token refresh via ``refresh_token``.
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

import aiohttp
from yarl import URL

from kmm.oci import auth, errors, mediatypes
from kmm.oci.descriptors import Descriptor, check_digest, sha256_digest

__all__ = ["Client", "check_name", "check_reference", "ssl_context"]

# The distribution spec's repository name and tag grammars.
_NAME = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


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
    """The first ``errors[].code`` and message of a distribution error body."""
    try:
        found = json.loads(body)["errors"][0]
        return str(found.get("code", "")), str(found.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return "", body[:200].decode(errors="replace")


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
        actions: Sequence[str] = ("pull", "push"),
        timeout: float = 300.0,
        endpoint: str | None = None,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self._base = URL(f"{'http' if plain_http else 'https'}://{endpoint or host}")
        # Dialling ``endpoint``, the server name and Host header stay ``host``'s.
        self._server_name = URL(f"https://{host}").host if endpoint and not plain_http else None
        self._host_header = {"Host": host} if endpoint else {}
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
            connector = aiohttp.TCPConnector(ssl=self._ssl)
            # trust_env off: a registry on loopback is never reached through a proxy.
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _basic_header(self) -> str:
        assert self._credentials is not None
        pair = f"{self._credentials.username}:{self._credentials.password}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"

    async def _send(
        self, method: str, url: URL, headers: Mapping[str, str], data: bytes | None, what: str
    ) -> _Answer:
        # A file-like body is written in chunks (bytes are sent whole, which
        # aiohttp warns about past 1 MiB: a layer blocks the loop meanwhile);
        # a fresh one per send, since a challenge answered means sending again.
        stream = io.BytesIO(data) if data is not None else None
        if self._on_request is not None:
            self._on_request()
        same_host = url.host == self._base.host and url.port == self._base.port
        try:
            async with self._session_now().request(
                method,
                url,
                headers={**self._host_header, **headers} if same_host else headers,
                data=stream,
                allow_redirects=False,
                server_hostname=self._server_name if same_host else None,
            ) as response:
                body = b"" if method == "HEAD" else await response.read()
                return _Answer(response.status, dict(response.headers), body)
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError, OSError) as err:
            raise errors.Unreachable(f"{what}: no answer from {self.host}: {err}") from err

    async def _token(self, challenge: auth.Challenge, name: str, what: str) -> str:
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise errors.UnexpectedResponse(
                f"{what}: {self.host}'s Bearer challenge has no usable realm ({realm!r})",
                status=401,
            )
        query = {"scope": f"repository:{name}:{self._actions}"} if name else {}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {"Authorization": self._basic_header()} if self._credentials else {}
        answer = await self._send("GET", URL(realm).with_query(query), headers, None, what)
        if answer.status in (401, 403):
            if self._credentials is None:
                raise errors.CredentialsRequired(
                    f"{what}: {self.host}'s token endpoint wants credentials and none are "
                    "configured for it"
                )
            raise errors.CredentialsRejected(
                f"{what}: {self.host}'s token endpoint {realm} refused the credentials of "
                f"user {self._credentials.username!r} ({answer.status})"
            )
        if answer.status != 200:
            code, message = _error_code(answer.body)
            raise errors.UnexpectedResponse(
                f"{what}: token endpoint {realm} answered {answer.status} {message}",
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
                f"{what}: token endpoint {realm} answered without a token", status=200
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
    ) -> _Answer:
        """One request, answering the registry's challenges; the answer if its
        status is ``expected``, else the typed error."""
        url = self._base.join(URL(path_or_url)) if isinstance(path_or_url, str) else path_or_url
        what = f"{method} {url.path}"
        fresh_token = False
        for _ in range(3):  # anonymous, then authenticated, then a renewed token
            sent = self._authorization(name)
            answer = await self._send(method, url, {**(headers or {}), **sent}, data, what)
            if answer.status in expected:
                return answer
            code, message = _error_code(answer.body)
            if answer.status == 401:
                if "Bearer" in sent.get("Authorization", ""):
                    challenge = self._challenge(answer, what)
                    if fresh_token or challenge.params.get("error") == "insufficient_scope":
                        raise errors.ScopeDenied(
                            f"{what}: {self.host} refused the granted token "
                            f"({code or challenge.params.get('error', '401')}: {message})"
                        )
                    del self._tokens[name]  # expired, perhaps: fetch a new one once
                if sent.get("Authorization", "").startswith("Basic"):
                    raise errors.CredentialsRejected(
                        f"{what}: {self.host} refused the credentials of user "
                        f"{self._credentials.username if self._credentials else ''!r}"
                    )
                challenge = self._challenge(answer, what)
                if challenge.scheme == "basic":
                    if self._credentials is None:
                        raise errors.CredentialsRequired(
                            f"{what}: {self.host} wants credentials and none are configured for it"
                        )
                    self._basic = True
                elif challenge.scheme == "bearer":
                    self._tokens[name] = await self._token(challenge, name, what)
                    fresh_token = True
                else:
                    raise errors.UnexpectedResponse(
                        f"{what}: {self.host} asks for {challenge.scheme} authentication, "
                        "which is not supported",
                        status=401,
                    )
                continue
            if answer.status == 403 and sent:
                raise errors.ScopeDenied(
                    f"{what}: {self.host} denied it ({code or 403}: {message})"
                )
            if answer.status == 404:
                kind = "manifest" if "/manifests/" in url.path else "blob"
                # A HEAD answer has no body, hence no code: the path says what is missing.
                raise errors.NotFound(f"{what}: {self.host} has no such {kind} ({code or 404})")
            raise errors.UnexpectedResponse(
                f"{what}: {self.host} answered {answer.status} {code} {message}".rstrip(),
                status=answer.status,
                code=code,
            )
        raise errors.ScopeDenied(f"{what}: {self.host} kept refusing a granted token")

    def _challenge(self, answer: _Answer, what: str) -> auth.Challenge:
        header = answer.headers.get("WWW-Authenticate", "")
        try:
            challenges = auth.parse_challenges(header)
        except ValueError as err:
            raise errors.UnexpectedResponse(
                f"{what}: {self.host} answered 401 without a usable challenge ({err})", status=401
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

    @staticmethod
    def _descriptor(answer: _Answer, what: str) -> Descriptor:
        digest = answer.headers.get("Docker-Content-Digest", "")
        if not digest and answer.body:
            digest = sha256_digest(answer.body)
        return Descriptor(
            media_type=answer.headers.get("Content-Type", "").split(";")[0].strip(),
            digest=check_digest(digest),
            size=int(answer.headers.get("Content-Length", "0") or 0),
        )

    async def head_manifest(self, name: str, reference: str) -> Descriptor:
        """The manifest's descriptor (media type, digest, size); NotFound if absent."""
        path = self._manifest_path(name, reference)
        answer = await self._request(
            "HEAD", path, name=name, expected=(200,), headers={"Accept": mediatypes.ACCEPT}
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
            "GET", path, name=name, expected=(200,), headers={"Accept": mediatypes.ACCEPT}
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
            await self._request("HEAD", path, name=name, expected=(200,))
        except errors.NotFound:
            return False
        return True

    async def get_blob(self, name: str, digest: str) -> bytes:
        """The blob's bytes (in memory: meant for small images), checked against ``digest``."""
        path = f"/v2/{check_name(name)}/blobs/{check_digest(digest)}"
        answer = await self._request("GET", path, name=name, expected=(200,))
        if sha256_digest(answer.body) != digest:
            raise errors.UnexpectedResponse(
                f"GET {path}: {self.host} sent bytes of digest {sha256_digest(answer.body)}",
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
