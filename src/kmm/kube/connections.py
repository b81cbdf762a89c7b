"""The connections a ``Client`` sends over: one pooled session, TLS as the kubeconfig says.

``Pool(access).session(certificate)`` is the aiohttp session (one pooled
keep-alive connector) of one cluster identity, made on first use and made
again when an exec plugin hands out another client certificate (the old one
closed first); ``close`` closes it. The pool has no limit of its own: the
client bounds its requests in flight, and each watch holds one connection.

TLS trusts what the kubeconfig says: with a CA (file or data) that CA
alone, as kubectl trusts it (the system's roots would also let any public CA
vouch for the API server); ``insecure-skip-tls-verify`` nothing; otherwise
the system's roots. A plain ``http:`` server gets no TLS. The client
certificate is loaded without touching a disk where Linux allows it (memory
files), else through a private temporary directory removed at once; a
certificate ssl refuses raises ``ConfigError``.

``Socket`` takes an answer's socket before its body is read, and closes it
first when the answer is left before its end (see its docstring).

Limits: the transport is aiohttp, which nothing outside ``kmm.kube`` (and
the registries' ``kmm.oci``) imports; sessions and the request semantics
(retries, slots, fences) are ``client``'s business.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from pathlib import Path

import aiohttp

from kmm.kube import credentials, errors, kubeconfigs

__all__ = ["Pool", "Socket"]


class Pool:
    """The session one ``Client`` sends over; close it once done."""

    def __init__(self, access: kubeconfigs.Access) -> None:
        self.access = access
        self._session: aiohttp.ClientSession | None = None
        self._session_certificate: credentials.Certificate | None = None

    async def session(self, certificate: credentials.Certificate | None) -> aiohttp.ClientSession:
        """The session presenting ``certificate`` (None: no client certificate)."""
        if self._session is not None and certificate == self._session_certificate:
            return self._session
        # First use, or an exec plugin handed out a new certificate.
        old, self._session = self._session, None
        if old is not None:
            await old.close()
        # No pool limit: requests are bounded by the slots, watches hold one each.
        connector = aiohttp.TCPConnector(ssl=self._ssl_context(certificate), limit=0)
        self._session = aiohttp.ClientSession(connector=connector)
        self._session_certificate = certificate
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _ssl_context(self, certificate: credentials.Certificate | None) -> ssl.SSLContext | bool:
        access = self.access
        if not access.server.startswith("https:"):
            return False
        if access.insecure:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif access.ca_file is not None or access.ca_data is not None:
            # The kubeconfig's CA alone, as kubectl trusts it: the system's
            # roots would also let any public CA vouch for this API server.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            if access.ca_file is not None:
                context.load_verify_locations(cafile=str(access.ca_file))
            if access.ca_data is not None:
                context.load_verify_locations(cadata=access.ca_data.decode())
        else:
            context = ssl.create_default_context()
        if certificate is not None:
            _load_certificate(context, certificate)
        return context


def _load_certificate(context: ssl.SSLContext, certificate: credentials.Certificate) -> None:
    # ssl loads a client certificate from files only. On Linux they are
    # memory files (memfd), opened through /proc/self/fd: nothing is written
    # anywhere, so a container with a read-only root filesystem (the chart's,
    # whose /tmp is not writable) loads it too, and the key never reaches a
    # disk. Elsewhere, a private temporary directory, removed after the call.
    try:
        if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
            _load_from_memory(context, certificate)
        else:
            _load_from_directory(context, certificate)
    except ssl.SSLError as err:
        raise errors.ConfigError(f"unusable client certificate: {err}") from err


def _load_from_memory(context: ssl.SSLContext, certificate: credentials.Certificate) -> None:
    descriptors: list[int] = []
    try:
        for name, data in (("cert", certificate.cert), ("key", certificate.key)):
            descriptor = os.memfd_create(f"kmm-tls-{name}", os.MFD_CLOEXEC)
            descriptors.append(descriptor)
            with open(descriptor, "wb", closefd=False) as stream:
                stream.write(data)
        cert, key = (f"/proc/self/fd/{descriptor}" for descriptor in descriptors)
        context.load_cert_chain(cert, key)
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def _load_from_directory(context: ssl.SSLContext, certificate: credentials.Certificate) -> None:
    with tempfile.TemporaryDirectory(prefix="kmm-tls-") as directory:
        cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        for path, data in ((cert, certificate.cert), (key, certificate.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
        context.load_cert_chain(str(cert), str(key))


class Socket:
    """The socket under an answer, taken while the answer still has it.

    ``drop`` closes the connection of an answer left before its end, socket
    first. ``release`` would close it the TLS way (send close_notify, keep
    the socket open until the server's comes back; asyncio waits up to 30 s
    for it). By then the connection is no longer the pool's, so ``close``
    does not end it either: its socket outlives the client, and once the
    event loop is gone the garbage collector finds it unclosed (a
    ResourceWarning). aiohttp does just that itself when a body's read fails
    or is cancelled, and forgets the connection: so the socket is taken
    before reading, and ``drop`` aborts it (closed on the loop's next turn,
    which it waits for).
    """

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        self._transport = protocol.transport if protocol is not None else None
        # None once the connection is already lost: nothing left to wait for.
        self._closed = protocol.closed if protocol is not None else None

    async def drop(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._response.close()
        if self._closed is not None:
            # An error here is the one the connection was lost with: it is closed.
            with contextlib.suppress(aiohttp.ClientError):
                await self._closed
