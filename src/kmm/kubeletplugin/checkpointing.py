"""The checkpoint of prepared claims: a snapshot and a journal, two-phase.

Two files in the plugin's data directory:

- ``checkpoint.json``, the snapshot (JSON)::

    {"version": 1, "checksum": <CRC-32 of data's UTF-8 bytes>, "data": "<JSON>"}

  with ``data`` = ``{"bootID": "<the node's boot>", "claims": {uid:
  ClaimRecord}}`` (``bootID`` absent in files written before it was kept).
  Keeping the payload as a string makes the checksum independent of key
  order or whitespace.
- ``checkpoint.journal``, the changes since the snapshot, one line each:
  ``{"put": {uid: ClaimRecord}, "drop": [uid]}`` (``journaling`` has the
  framing and what a crash can leave of it).

``load`` reads the snapshot and replays the journal; ``commit`` appends one
change and applies it in memory; ``save`` writes a new snapshot and begins
an empty journal (at the plugin's start, and when the journal passes
``JOURNAL_LIMIT``). A change sets or removes whole records, so replaying a
journal over a snapshot that already holds it changes nothing.

Two phases: a claim is recorded ``PrepareStarted`` before the policy and the
CDI spec are touched, and ``PrepareCompleted`` with its devices (and the CDI
edits, so a spec lost to a reboot of ``/var/run`` can be rebuilt without the
policy) once they are done. A crash in between leaves ``PrepareStarted``:
the next prepare of that claim redoes the work (the policy's ``prepare`` is
idempotent per claim) and an unprepare cleans it up.

A third state, ``ReleasePending``, is a claim whose prepare failed and whose
undo failed too: the policy may still hold its devices. It is never answered
as prepared; the next prepare of it releases it first, and an unprepare
releases and forgets it (``plugins``). The state came after version 1 and
the version stayed: every file written before it reads as it did, and a
build older than it refuses a file holding one (an unknown state) instead of
forgetting a release. Bumping the version would refuse every file, pending
release or not.

``boot_id`` says which boot of the node began the journal: after a reboot
nothing prepared before it is in use any more (the plugin prepares such
claims again when the kubelet asks), and an unsynced change a power loss
undid must not make a claim hold its devices forever.

A snapshot that cannot be parsed, has the wrong checksum or an unknown
version, and a journal with a damaged line written in this boot, raise
``CheckpointCorruptedError`` naming the file and the problem. Neither is
replaced silently: dropping it would forget claims that running containers
use.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import types
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypedDict

from kmm.kubeletplugin import cdi, claims, errors, files, journaling

__all__ = ["VERSION", "Checkpoint", "ClaimRecord", "PreparedDevice"]

VERSION = 1
FILE_NAME = "checkpoint.json"
JOURNAL_NAME = "checkpoint.journal"
# A journal past this many bytes is folded into a new snapshot: a one-claim
# prepare and unprepare of a kmod device add about 600 bytes (UIDs of 36
# characters), so about 1,700 of them.
JOURNAL_LIMIT = 1 << 20

State = Literal["PrepareStarted", "PrepareCompleted", "ReleasePending"]
STARTED: State = "PrepareStarted"
COMPLETED: State = "PrepareCompleted"
RELEASE_PENDING: State = "ReleasePending"


class PreparedDeviceDict(TypedDict):
    requestNames: list[str]
    poolName: str
    deviceName: str
    cdiDeviceIDs: list[str]
    edits: cdi.ContainerEdits


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device prepared for a claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    edits: cdi.ContainerEdits

    def to_dict(self) -> PreparedDeviceDict:
        return {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIDs": list(self.cdi_device_ids),
            "edits": self.edits,
        }

    @classmethod
    def from_dict(cls, raw: PreparedDeviceDict) -> PreparedDevice:
        return cls(
            request_names=tuple(raw["requestNames"]),
            pool_name=raw["poolName"],
            device_name=raw["deviceName"],
            cdi_device_ids=tuple(raw["cdiDeviceIDs"]),
            edits=raw["edits"],
        )


@dataclasses.dataclass(frozen=True)
class ClaimRecord:
    namespace: str
    name: str
    state: State
    devices: tuple[PreparedDevice, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [device.to_dict() for device in self.devices],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClaimRecord:
        state = raw["state"]
        if state not in (STARTED, COMPLETED, RELEASE_PENDING):
            raise ValueError(f"unknown claim state {state!r}")
        return cls(
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            state=state,
            devices=tuple(PreparedDevice.from_dict(d) for d in raw.get("devices", [])),
        )


class Checkpoint:
    """The claims this plugin prepared, kept in memory and on disk."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.path = directory / FILE_NAME
        self.claims: dict[claims.ClaimUID, ClaimRecord] = {}
        self.boot_id: str | None = None
        self.journal = journaling.Journal(directory / JOURNAL_NAME)
        self.journal_limit = JOURNAL_LIMIT
        # Each record's JSON, kept while the record is the same object:
        # a journal line or a snapshot encodes only the claims that changed.
        self._encoded: dict[claims.ClaimUID, tuple[ClaimRecord, str]] = {}

    def load(self, *, boot_id: str | None = None) -> journaling.Reading | None:
        """Read the snapshot, then replay the journal over it.

        A missing snapshot is an empty checkpoint. ``boot_id`` (the current
        boot) lets the journal's reading drop an end a reboot tore
        (``journaling``); without it, reading is strict. Returns the
        journal's reading, which says what was dropped.
        """
        self.journal.close()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.claims, self.boot_id = {}, None
        except OSError as err:
            raise errors.CheckpointError(f"cannot read checkpoint {self.path}: {err}") from err
        else:
            self.claims, self.boot_id = _decode(self.path, raw)
        self._encoded = {}
        reading = journaling.read(self.journal.path, boot_id=boot_id)
        if reading is not None:
            self.boot_id = reading.boot_id
            for number, change in enumerate(reading.changes, start=2):
                try:
                    self._apply(_records(change.get("put", {})), change.get("drop", []))
                except (ValueError, KeyError, TypeError, AttributeError) as err:
                    raise errors.CheckpointCorruptedError(
                        self.journal.path, f"line {number}: malformed change ({err!r})"
                    ) from err
        return reading

    def save(self) -> None:
        """Write the in-memory state as a new snapshot and begin an empty journal.

        Both durably (fsynced, directory too), in that order: a crash between
        leaves the new snapshot and the old journal, whose changes replay to
        the same state (each sets or removes a claim's record).
        """
        try:
            files.write_atomically(
                self.path, self.snapshot(), sync=files.Sync.ENTRY, parent_mode=0o700
            )
            self.journal.begin(self.boot_id)
        except OSError as err:
            raise errors.CheckpointError(f"cannot write checkpoint {self.path}: {err}") from err

    def snapshot(self) -> bytes:
        """The snapshot file's content for the state in memory."""
        data = self._encode()
        envelope = {"version": VERSION, "checksum": zlib.crc32(data.encode()), "data": data}
        return json.dumps(envelope).encode()

    def commit(
        self,
        put: Mapping[claims.ClaimUID, ClaimRecord] = types.MappingProxyType({}),
        drop: Iterable[claims.ClaimUID] = (),
    ) -> None:
        """Record claims set and removed: one journal line, then the memory.

        Not fsynced (``plugins`` says why). On an error nothing changes in
        memory, and the file still ends with its last whole change. A journal
        past ``journal_limit`` bytes is folded into a new snapshot afterwards.
        """
        dropped = [uid for uid in drop if uid not in put]
        records = ",".join(
            f"{json.dumps(uid)}:{self._encoded_record(uid, record)}" for uid, record in put.items()
        )
        entry = f'{{"drop":{json.dumps(dropped)},"put":{{{records}}}}}'
        if not self.journal.is_open:
            self.save()  # none begun yet, or one whose end is unknown: begin anew
        self.journal.append(journaling.frame(entry))
        self._apply(put, dropped)
        if self.journal.size > self.journal_limit:
            self.save()

    def close(self) -> None:
        self.journal.close()

    def _apply(self, put: Mapping[claims.ClaimUID, ClaimRecord], drop: Iterable[str]) -> None:
        for uid in drop:
            self.claims.pop(claims.ClaimUID(uid), None)
            self._encoded.pop(claims.ClaimUID(uid), None)
        self.claims.update(put)

    def _encoded_record(self, uid: claims.ClaimUID, record: ClaimRecord) -> str:
        cached = self._encoded.get(uid)
        if cached is None or cached[0] is not record:
            cached = (record, json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")))
            self._encoded[uid] = cached
        return cached[1]

    def _encode(self) -> str:
        """``{"claims": {...}}`` as ``json.dumps(sort_keys=True)`` compact would write it."""
        parts = [
            f"{json.dumps(uid)}:{self._encoded_record(uid, record)}"
            for uid, record in sorted(self.claims.items())
        ]
        self._encoded = {uid: self._encoded[uid] for uid in self.claims}
        # Keys in sorted order, as json.dumps(sort_keys=True) puts them.
        boot = "" if self.boot_id is None else f'"bootID":{json.dumps(self.boot_id)},'
        return "{" + boot + '"claims":{' + ",".join(parts) + "}}"


def _records(raw: Mapping[str, Any]) -> dict[claims.ClaimUID, ClaimRecord]:
    return {claims.ClaimUID(uid): ClaimRecord.from_dict(record) for uid, record in raw.items()}


def _decode(
    path: pathlib.Path, raw: bytes
) -> tuple[dict[claims.ClaimUID, ClaimRecord], str | None]:
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise errors.CheckpointCorruptedError(path, f"not JSON ({err})") from err
    if not isinstance(envelope, dict):
        raise errors.CheckpointCorruptedError(path, "not a JSON object")
    version = envelope.get("version")
    if version != VERSION:
        raise errors.CheckpointCorruptedError(
            path, f"unsupported version {version!r} (this build reads {VERSION})"
        )
    data = envelope.get("data")
    checksum = envelope.get("checksum")
    if not isinstance(data, str) or not isinstance(checksum, int):
        raise errors.CheckpointCorruptedError(path, "missing data or checksum")
    actual = zlib.crc32(data.encode())
    if actual != checksum:
        raise errors.CheckpointCorruptedError(
            path, f"checksum mismatch (recorded {checksum}, computed {actual})"
        )
    try:
        payload = json.loads(data)
        boot_id = payload.get("bootID")
        if boot_id is not None and not isinstance(boot_id, str):
            raise TypeError(f"bootID {boot_id!r} is not a string")
        return _records(payload["claims"]), boot_id
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise errors.CheckpointCorruptedError(path, f"malformed content ({err!r})") from err
