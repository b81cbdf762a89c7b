"""Taking the API server's in-flight slots, so that everyone else is throttled.

A sandbox started with a low ``--max-mutating-requests-inflight`` (which
turns API Priority and Fairness off, ``cluster.Options``) answers a write
past the limit 429 with ``Retry-After`` at once. ``stalled_write`` takes one
of those slots and keeps it: a create whose headers promise a body that
never comes holds its slot in the server's handler until the connection
closes. It must come from a user the limit applies to (not system:masters,
which is exempt) and who may create ConfigMaps in ``namespace`` (a refusal
frees the slot at once): the admin's certificate impersonates ``user``.

Nothing is created: the body never arrives. The hold is bounded by the
server's own request timeout (60 s), far beyond what a test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
from collections.abc import AsyncIterator

from kmm.kube import kubeconfigs

__all__ = ["stalled_write"]


@contextlib.asynccontextmanager
async def stalled_write(
    access: kubeconfigs.Access, namespace: str, *, user: str, answer_wait: float = 2.0
) -> AsyncIterator[bool]:
    """Hold one write slot for the block; yields False if the server refused
    the write at once (429: the slots were taken already), True if it holds."""
    server = urllib.parse.urlsplit(access.server)
    if access.client_cert_file is None or access.client_key_file is None:
        raise ValueError("a stalled write needs the sandbox admin's certificate files")
    context = ssl.create_default_context(
        cafile=str(access.ca_file) if access.ca_file is not None else None
    )
    context.load_cert_chain(str(access.client_cert_file), str(access.client_key_file))
    reader, writer = await asyncio.open_connection(
        server.hostname, server.port, ssl=context, server_hostname=server.hostname
    )
    try:
        writer.write(
            (
                f"POST /api/v1/namespaces/{namespace}/configmaps HTTP/1.1\r\n"
                f"Host: {server.netloc}\r\n"
                f"Impersonate-User: {user}\r\n"
                "Content-Type: application/json\r\n"
                "Content-Length: 4096\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        # The server answers at once only when it refuses (429, or 403 for
        # a user without the right); a request in its handler waits for the body.
        try:
            status = await asyncio.wait_for(reader.readline(), timeout=answer_wait)
        except TimeoutError:
            yield True
        else:
            if not status.startswith(b"HTTP/1.1 429"):
                raise RuntimeError(f"the stalled write was answered {status!r}, not held")
            yield False
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
