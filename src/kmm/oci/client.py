"""A client of one registry host over the OCI distribution API.

``Client`` holds the API kmm uses (manifests: HEAD, GET, PUT, DELETE;
blobs: HEAD, GET, monolithic upload) and the request loop under it: send,
meet the registry's challenge (:mod:`kmm.oci.authorizing`), send again, and
turn the last answer into a typed outcome (``errors``): 404 is ``NotFound``;
a 403 to an authenticated request is ``ScopeDenied``; anything else not
expected is ``UnexpectedResponse``. Each error's ``public`` text holds no
response body and no socket error (``errors``). Manifest and blob reads
follow redirects; where requests go, what is dialled and TLS are
:mod:`kmm.oci.transport`'s. Every repository name and reference that goes
into a URL path is checked against the distribution grammar first
(``check_name``, ``check_reference``).

Limits: no chunked or resumable uploads, no cross-repository mounts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from yarl import URL

from kmm.oci import auth, authorizing, destinations, errors, mediatypes, transport
from kmm.oci.descriptors import Descriptor, check_digest, sha256_digest

__all__ = ["Client", "check_name", "check_reference"]

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
        self._transport = transport.Transport(
            host,
            ca_files=ca_files,
            verify_tls=verify_tls,
            plain_http=plain_http,
            insecure=insecure,
            timeout=timeout,
            endpoint=endpoint,
            guard=guard,
            on_request=on_request,
            max_body=max_body,
        )
        self._authorizer = authorizing.Authorizer(
            self._transport, credentials=credentials, actions=actions
        )

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
        await self._transport.close()

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
    ) -> transport.Answer:
        """One request, answering the registry's challenges (and following
        its redirects when ``follow``); the answer if its status is
        ``expected``, else the typed error."""
        url = self._transport.url(path_or_url)
        what = f"{method} {url.path}"
        fresh_token = False
        for _ in range(3):  # anonymous, then authenticated, then a renewed token
            sent = self._authorizer.headers(name)
            answer = await self._transport.exchange(
                method, url, {**(headers or {}), **sent}, data, what, follow=follow
            )
            if answer.status in expected:
                return answer
            if answer.status == 401:
                fetched = await self._authorizer.meet(
                    answer, sent=sent, name=name, what=what, fresh_token=fresh_token
                )
                fresh_token = fresh_token or fetched
                continue
            code, message = errors.first_error(answer.body)
            coded = errors.public_status(answer.status, code)
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

    # The API.

    async def ping(self) -> None:
        """``GET /v2/``: the registry answers and accepts our credentials (if it
        asks for any)."""
        await self._request("GET", "/v2/", name="", expected=(200,))

    def _manifest_path(self, name: str, reference: str) -> str:
        return f"/v2/{check_name(name)}/manifests/{check_reference(reference)}"

    def _descriptor(self, answer: transport.Answer, what: str) -> Descriptor:
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

    async def _read_manifest(
        self, method: str, name: str, reference: str
    ) -> tuple[Descriptor, transport.Answer]:
        """GET or HEAD a manifest, following redirects: its descriptor and the answer."""
        path = self._manifest_path(name, reference)
        answer = await self._request(
            method,
            path,
            name=name,
            expected=(200,),
            headers={"Accept": mediatypes.ACCEPT},
            follow=True,
        )
        return self._descriptor(answer, f"{method} {path}"), answer

    async def head_manifest(self, name: str, reference: str) -> Descriptor:
        """The manifest's descriptor (media type, digest, size); NotFound if absent."""
        found, _ = await self._read_manifest("HEAD", name, reference)
        return found

    async def exists(self, name: str, reference: str) -> Descriptor | None:
        """The manifest's descriptor, or None when it is missing: 404, or a
        granted token refused (``ScopeDenied``). Authentication errors and
        everything else raise."""
        try:
            return await self.head_manifest(name, reference)
        except (errors.NotFound, errors.ScopeDenied):
            return None

    async def get_manifest(self, name: str, reference: str) -> tuple[Descriptor, bytes]:
        found, answer = await self._read_manifest("GET", name, reference)
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
        target = self._transport.url(location).update_query(digest=digest)
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
