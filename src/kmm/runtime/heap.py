"""Giving a list's transient memory back to the system.

A list of 5,000 Nodes parses page by page into dicts that the informer
projects and drops; CPython hands the large ones (above its 512-byte small
object allocator) to the C library's ``malloc``, and glibc keeps freed pages
of its heaps mapped: the process's resident size stays at the list's peak
long after the cache holds only the projections. ``trim`` asks glibc to
return every whole free page (``malloc_trim(0)``, which since glibc 2.8
releases pages inside the heaps too, not just the top). The operator
calls it after each list of its large informers (a relist hook, in
``operator.wiring``): lists are rare (start, a 410 relist), and a trim costs
a walk of the free lists.

Limits: glibc only; elsewhere (musl, macOS) ``trim`` does nothing and says
so once at debug level. Pages CPython's own arenas hold are not touched.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

__all__ = ["trim"]

_log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    # The process's own symbols: the C library it runs on (no lookup by
    # name, which would import ``ctypes.util`` and its subprocess machinery).
    try:
        found: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        _log.debug("no malloc_trim in the C library: lists' memory stays mapped")
        return None
    return found


def trim() -> bool:
    """Return free heap pages to the system; whether any were (False also
    where the C library has no ``malloc_trim``)."""
    found = _malloc_trim()
    return found is not None and bool(found(0))
