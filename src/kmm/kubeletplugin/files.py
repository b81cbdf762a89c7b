"""Atomic file writes and owner-only directories for files kept on a node.

Every file the plugin writes (CDI specs, the checkpoint) goes through
``write_atomically``: a temporary file in the same directory, fsync, rename,
fsync of the directory. A reader (the container runtime, our own restart)
sees the old content or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

__all__ = ["ensure_dir", "remove", "write_atomically"]


def ensure_dir(path: pathlib.Path, mode: int = 0o700) -> None:
    """Create ``path`` (and parents) with ``mode`` if missing; existing dirs are left as they are."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)


def write_atomically(path: pathlib.Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def remove(path: pathlib.Path) -> bool:
    """Remove ``path`` if it exists and make that durable; say whether it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(path.parent)
    return True


def _fsync_dir(path: pathlib.Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
