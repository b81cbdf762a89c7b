"""Atomic file writes and owner-only directories for files kept on a node.

Every file the plugin replaces (CDI specs, the checkpoint's snapshot and a
new journal) goes through ``replacing``: a temporary file in the same
directory, renamed over the target, so a reader (the container runtime, our
own restart) sees the old content or the new one, never a torn file, even if
the process is killed. A killed process needs nothing more: its writes are
in the page cache.

A power loss or a kernel crash needs fsyncs (``Sync``): ``ENTRY`` fsyncs
the data before the rename and the directory after it, so the new version
survives whole; ``NONE`` is for files rebuilt from others, or kept on a
tmpfs (``/var/run/cdi`` on a real node), where an fsync does nothing. Which
write needs which is ``plugins``'s and ``checkpointing``'s to say; appends
to the checkpoint's journal are ``journaling``'s.
"""

from __future__ import annotations

import contextlib
import enum
import os
import pathlib
from collections.abc import Iterator

__all__ = [
    "Sync",
    "ensure_dir",
    "fsync_dir",
    "remove",
    "replacing",
    "write_all",
    "write_atomically",
]


class Sync(enum.Enum):
    """What of a replaced file must survive a power loss."""

    NONE = "none"  # readers see old or new; after a power loss, anything
    ENTRY = "entry"  # the new version, whole


def ensure_dir(path: pathlib.Path, mode: int = 0o700) -> None:
    """Create ``path`` (and parents) with ``mode`` if missing; existing dirs are left as they are."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)


@contextlib.contextmanager
def replacing(
    path: pathlib.Path, *, mode: int = 0o600, parent_mode: int | None = None, flags: int = 0
) -> Iterator[int]:
    """A descriptor on a temporary file that replaces ``path`` when the block ends.

    The temporary file sits beside ``path`` and is renamed over it only if
    the block ends without an error; otherwise it is removed. With
    ``parent_mode``, a missing directory is made (with that mode) when the
    open finds it gone: checked on failure, not with a ``mkdir`` per write.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    flags |= os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(tmp, flags, mode)
    except FileNotFoundError:
        if parent_mode is None:
            raise
        ensure_dir(path.parent, parent_mode)  # first use, or wiped (a reboot of /var/run)
        fd = os.open(tmp, flags, mode)
    try:
        try:
            yield fd
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomically(
    path: pathlib.Path,
    data: bytes,
    *,
    mode: int = 0o600,
    sync: Sync = Sync.ENTRY,
    parent_mode: int | None = None,
) -> None:
    """Replace ``path`` with ``data`` so that readers never see a partial file."""
    with replacing(path, mode=mode, parent_mode=parent_mode) as fd:
        write_all(fd, data)
        if sync is not Sync.NONE:
            os.fsync(fd)
    if sync is Sync.ENTRY:
        fsync_dir(path.parent)


def remove(path: pathlib.Path, *, durable: bool = True) -> bool:
    """Remove ``path`` if it exists (durably unless told otherwise); say whether it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(path.parent)
    return True


def fsync_dir(path: pathlib.Path) -> None:
    """Make the directory's entries (renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
