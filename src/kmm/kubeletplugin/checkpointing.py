"""The checkpoint of prepared claims: versioned, checksummed, two-phase.

File layout (JSON)::

    {"version": 1, "checksum": <CRC-32 of data's UTF-8 bytes>, "data": "<JSON>"}

with ``data`` = ``{"bootID": "<the node's boot>", "claims": {uid: ClaimRecord}}``
(``bootID`` absent in files written before it was kept). Keeping the
payload as a string makes the checksum independent of key order or
whitespace.

Two phases: a claim is recorded ``PrepareStarted`` before the policy and the
CDI spec are touched, and ``PrepareCompleted`` with its devices (and the CDI
edits, so a spec lost to a reboot of ``/var/run`` can be rebuilt without the
policy) once they are done. A crash in between leaves ``PrepareStarted``:
the next prepare of that claim redoes the work (the policy's ``prepare`` is
idempotent per claim) and an unprepare cleans it up.

``boot_id`` says which boot of the node wrote the file: after a reboot
nothing prepared before it is in use any more (the plugin prepares such
claims again when the kubelet asks), and a record whose unprepare a power
loss undid must not hold its devices forever.

A checkpoint that cannot be parsed, has the wrong checksum or an unknown
version raises ``CheckpointCorruptedError`` naming the file and the problem.
It is never replaced silently: dropping it would forget claims that running
containers use.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zlib
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from kmm.kubeletplugin import cdi, claims, errors, files

__all__ = ["VERSION", "Checkpoint", "ClaimRecord", "PreparedDevice"]

VERSION = 1
FILE_NAME = "checkpoint.json"

State = Literal["PrepareStarted", "PrepareCompleted"]
STARTED: State = "PrepareStarted"
COMPLETED: State = "PrepareCompleted"


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
        if state not in (STARTED, COMPLETED):
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
        self.writes = 0
        # Each record's JSON, kept while the record is the same object:
        # a save re-encodes only the claims that changed since the last.
        self._encoded: dict[claims.ClaimUID, tuple[ClaimRecord, str]] = {}

    def load(self) -> None:
        """Read the file; a missing file is an empty checkpoint."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.claims, self.boot_id = {}, None
            return
        except OSError as err:
            raise errors.CheckpointError(f"cannot read checkpoint {self.path}: {err}") from err
        self.claims, self.boot_id = _decode(self.path, raw)

    def save(self, sync: files.Sync = files.Sync.ENTRY) -> None:
        """Write the in-memory state atomically (``sync``: what a power loss keeps)."""
        data = self._encode()
        envelope = {
            "version": VERSION,
            "checksum": zlib.crc32(data.encode()),
            "data": data,
        }
        try:
            files.write_atomically(
                self.path, json.dumps(envelope).encode(), sync=sync, parent_mode=0o700
            )
        except OSError as err:
            raise errors.CheckpointError(f"cannot write checkpoint {self.path}: {err}") from err
        self.writes += 1

    def _encode(self) -> str:
        """``{"claims": {...}}`` as ``json.dumps(sort_keys=True)`` compact would write it."""
        parts = []
        encoded: dict[claims.ClaimUID, tuple[ClaimRecord, str]] = {}
        for uid, record in sorted(self.claims.items()):
            cached = self._encoded.get(uid)
            if cached is None or cached[0] is not record:
                text = json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"))
                cached = (record, text)
            encoded[uid] = cached
            parts.append(f"{json.dumps(uid)}:{cached[1]}")
        self._encoded = encoded
        # Keys in sorted order, as json.dumps(sort_keys=True) puts them.
        boot = "" if self.boot_id is None else f'"bootID":{json.dumps(self.boot_id)},'
        return "{" + boot + '"claims":{' + ",".join(parts) + "}}"


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
        records = {
            claims.ClaimUID(uid): ClaimRecord.from_dict(record)
            for uid, record in payload["claims"].items()
        }
        return records, boot_id
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise errors.CheckpointCorruptedError(path, f"malformed content ({err!r})") from err
