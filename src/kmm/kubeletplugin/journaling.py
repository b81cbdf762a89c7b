"""An append-only journal of checkpoint changes: framing, reading, appending.

The checkpoint (``checkpointing``) is a snapshot file plus this journal of
the changes made since it was written. A change is one appended line, so a
prepare or an unprepare costs one ``write`` to an open file instead of a
rewritten, fsynced and renamed snapshot.

File layout, one line per entry, each line ``<CRC-32 of the JSON, 8 hex
digits> <compact JSON>\\n`` (``json.dumps`` escapes newlines, so a line
never holds one)::

    3c1a0b9e {"journal":1,"bootID":"<boot that began the journal>"}
    0f3e5d21 {"put":{uid: record, ...},"drop":[uid, ...]}
    ...

The header is written durably when the journal is begun (temporary file,
fsync, rename, directory fsync); appends are not fsynced (``plugins`` says
why). So what a crash can leave is bounded, and reading tells it apart from
damage:

- A last line without its newline is a write a killed process did not
  finish (nobody was answered for it): it is dropped, in any boot.
- In the boot that began the journal, every complete line was written whole
  into the page cache, which a killed process does not lose: a line that
  fails its checksum or does not parse is damage, and reading raises
  ``CheckpointCorruptedError`` naming the file and the line. Nothing is
  dropped or rewritten.
- After a reboot (``boot_id`` differs from the header's), the unsynced end
  of the file may hold zeros or stale bytes in any order: the first bad line
  and every line after it are dropped, and the caller is told how many.

An append that fails part way (a full disk) is cut back to the last whole
line; if even that fails, the journal is closed, and the owner must begin a
new one before appending again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import zlib
from typing import Any

from kmm.kubeletplugin import errors, files

__all__ = ["VERSION", "Journal", "Reading", "frame", "read"]

VERSION = 1


def frame(entry: str) -> bytes:
    """One journal line: the checksum, a space, the JSON text, a newline."""
    data = entry.encode()
    return b"%08x %s\n" % (zlib.crc32(data), data)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a journal file held: its boot, its changes, what was dropped."""

    boot_id: str | None
    changes: tuple[dict[str, Any], ...]
    dropped: int  # lines lost to a crash: an unfinished last one, or a torn end
    torn: bool  # lines were dropped because a reboot tore the end


def read(path: pathlib.Path, *, boot_id: str | None) -> Reading | None:
    """The journal at ``path`` (``None`` if there is none), as the rules above say.

    ``boot_id`` is the current boot; ``None`` reads strictly, as within the
    boot that began the journal.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise errors.CheckpointError(f"cannot read checkpoint journal {path}: {err}") from err
    *lines, unfinished = raw.split(b"\n")
    if not lines:
        raise errors.CheckpointCorruptedError(path, "no header line")
    header = _entry(lines[0])
    if header is None or header.get("journal") != VERSION:
        problem = "unreadable header" if header is None else f"header {header!r}"
        raise errors.CheckpointCorruptedError(
            path, f"{problem} (this build reads journal version {VERSION})"
        )
    began = header.get("bootID")
    if began is not None and not isinstance(began, str):
        raise errors.CheckpointCorruptedError(path, f"bootID {began!r} is not a string")
    rebooted = boot_id is not None and began != boot_id
    changes: list[dict[str, Any]] = []
    dropped = 1 if unfinished else 0
    for number, line in enumerate(lines[1:], start=2):
        change = _entry(line)
        if change is None or not _is_change(change):
            if not rebooted:
                raise errors.CheckpointCorruptedError(
                    path, f"line {number} fails its checksum or is not a change"
                )
            return Reading(began, tuple(changes), dropped + len(lines) - number + 1, torn=True)
        changes.append(change)
    return Reading(began, tuple(changes), dropped, torn=False)


def _entry(line: bytes) -> dict[str, Any] | None:
    """The JSON object of a line whose checksum holds; ``None`` if it does not."""
    checksum, _, data = line.partition(b" ")
    try:
        if len(checksum) != 8 or int(checksum, 16) != zlib.crc32(data):
            return None
        entry = json.loads(data)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _is_change(entry: dict[str, Any]) -> bool:
    return isinstance(entry.get("put", {}), dict) and isinstance(entry.get("drop", []), list)


class Journal:
    """The open journal file a checkpoint appends its changes to."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.size = 0
        self._fd: int | None = None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def begin(self, boot_id: str | None) -> None:
        """Replace the journal with an empty one, durably (header only)."""
        self.close()
        header = json.dumps({"journal": VERSION, "bootID": boot_id}, separators=(",", ":"))
        data = frame(header)
        kept: int | None = None
        try:
            with files.replacing(self.path, flags=os.O_APPEND) as fd:
                files.write_all(fd, data)
                os.fsync(fd)
                kept = os.dup(fd)  # the same file, once renamed into place
            files.fsync_dir(self.path.parent)
        except BaseException:
            if kept is not None:
                os.close(kept)
            raise
        self._fd, self.size = kept, len(data)

    def append(self, line: bytes) -> None:
        """Append one framed line; on failure the file ends with a whole line again."""
        if self._fd is None:
            raise errors.CheckpointError(f"checkpoint journal {self.path} is not open")
        try:
            files.write_all(self._fd, line)
        except OSError as err:
            try:
                os.ftruncate(self._fd, self.size)
            except OSError:
                self.close()  # its end is unknown: only a new journal is safe
            raise errors.CheckpointError(
                f"cannot write checkpoint journal {self.path}: {err}"
            ) from err
        self.size += len(line)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def set_aside(self, suffix: str) -> pathlib.Path | None:
        """Keep the journal's bytes under another name (for a human to read)."""
        aside = self.path.with_name(f"{self.path.name}.{suffix}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, aside)
            return aside
        return None
