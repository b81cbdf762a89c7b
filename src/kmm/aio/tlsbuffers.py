"""The read buffer of asyncio's TLS connections, sized for a long-lived process.

asyncio reads each TLS connection's ciphertext into a buffer of
``asyncio.sslproto.SSLProtocol.max_size`` bytes (256 KiB in CPython 3.11 to
3.13), made and zeroed with the connection and kept for its life. The
operator holds a connection per watch for good (seven) and more for its
requests: 1.75 MiB resident in buffers that a TLS record (at most 16 KiB of
data) never fills; ``bench/bench_operator.py`` measured 2.2 MiB less with
32 KiB. A read then takes at most 32 KiB; a large answer (a list page)
takes more reads, each a record or two.

``limit`` sets the size for every TLS connection made afterwards in this
process, whoever makes it (asyncio has no per-connection setting, and
aiohttp none above it): only a process's entry point calls it, before its
first connection. A Python whose asyncio lacks the attribute is left alone.
"""

from __future__ import annotations

from asyncio import sslproto
from typing import Final

__all__ = ["SIZE", "limit"]

#: Two full TLS records.
SIZE: Final = 32 * 1024


def limit() -> None:
    """Make TLS connections opened from now on read into ``SIZE``-byte buffers."""
    if hasattr(sslproto.SSLProtocol, "max_size"):
        sslproto.SSLProtocol.max_size = SIZE
