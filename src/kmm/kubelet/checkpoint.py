"""The kubelet's DRA checkpoint, ``<root>/var/lib/kubelet/dra_manager_state``, byte for byte.

The kubelet (``pkg/kubelet/cm/dra/state``; the same in 1.35 and 1.37) writes
``{"Data":"<inner JSON>","Checksum":<CRC-32 IEEE of Data's bytes>}`` where the
inner JSON is ``{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1",
"ClaimInfoStateList":[...]}``, each claim ``{ClaimUID, ClaimName, Namespace,
PodUIDs: {uid: {}}, DriverState: {driver: {Devices: [...]}}}`` and each device
``{PoolName, DeviceName, ShareID, RequestNames, CDIDeviceIDs}``. It is Go's
``encoding/json``: fields in declaration order, map keys sorted, nil slices,
maps and pointers as ``null``, no spaces, and ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped as ``\\u003c`` and so on. ``encode`` writes exactly that, so a
file the emulator writes is the file the kubelet would write for the same
state.

1.37 added one field without changing the version: a driver's
``skipNodeOperations`` (``state/state.go``, tagged ``omitempty``: written only
for a claim whose devices skip a node operation, which takes the
``DRAOptionalNodeOperations`` gate). A file without it, as every 1.35 file
is, reads and writes the same as before. A driver with no device recorded
(its state before the prepare call) has ``"Devices":null``, as the kubelet's
nil slice.

Reading is as lenient as the kubelet's: missing fields take their zero value
(an older kubelet's file lacks ``RequestNames`` and ``ShareID``), field names
match regardless of case (Go's decoder does; 1.37's
``TestCheckpointVersionCompatibility`` reads lower-case ones), the
``apiVersion`` is not checked, unknown fields are ignored. A checksum that
does not match, or a file that is not this JSON at all, is
``CorruptCheckpoint``: reported, never silently replaced (``Store.load``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "API_VERSION",
    "FILE_NAME",
    "KIND",
    "ClaimState",
    "CorruptCheckpoint",
    "Device",
    "Store",
    "decode",
    "encode",
]

KIND: Final = "DRACheckpoint"
API_VERSION: Final = "checkpoint.dra.kubelet.k8s.io/v1"
FILE_NAME: Final = "dra_manager_state"

# Go's encoding/json escapes these in every string (HTML safety).
_GO_ESCAPES: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


class CorruptCheckpoint(Exception):
    """The checkpoint cannot be trusted: bad JSON, wrong shape, or a checksum mismatch."""


@dataclasses.dataclass(frozen=True)
class Device:
    """One prepared device of a claim, as the kubelet records it."""

    pool_name: str
    device_name: str
    share_id: str | None = None
    request_names: tuple[str, ...] | None = None
    cdi_device_ids: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ClaimState:
    """One claim the kubelet prepared (or is preparing) and the pods using it.

    ``pod_uids`` None and ``driver_state`` None are Go's nil (``null``), an
    empty set or mapping is ``{}``: both occur in real files."""

    claim_uid: str
    claim_name: str
    namespace: str
    pod_uids: frozenset[str] | None = None
    driver_state: Mapping[str, tuple[Device, ...]] | None = None
    # Per driver, the node operations its devices all skip (1.37's
    # DriverState.SkipNodeOperations); drivers that skip none are absent.
    skip_node_operations: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def _go_json(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in _GO_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def _strings(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def _device_json(device: Device) -> dict[str, Any]:
    return {
        "PoolName": device.pool_name,
        "DeviceName": device.device_name,
        "ShareID": device.share_id,
        "RequestNames": _strings(device.request_names),
        "CDIDeviceIDs": _strings(device.cdi_device_ids),
    }


def _claim_json(claim: ClaimState) -> dict[str, Any]:
    return {
        "ClaimUID": claim.claim_uid,
        "ClaimName": claim.claim_name,
        "Namespace": claim.namespace,
        "PodUIDs": None if claim.pod_uids is None else {uid: {} for uid in sorted(claim.pod_uids)},
        "DriverState": None
        if claim.driver_state is None
        else {
            driver: _driver_json(devices, claim.skip_node_operations.get(driver, ()))
            for driver, devices in sorted(claim.driver_state.items())
        },
    }


def _driver_json(devices: tuple[Device, ...], skips: tuple[str, ...]) -> dict[str, Any]:
    # The kubelet only ever appends to a nil slice: no device is null, not [].
    found: dict[str, Any] = {"Devices": [_device_json(d) for d in devices] or None}
    if skips:  # omitempty
        found["skipNodeOperations"] = list(skips)
    return found


def encode(claims: Sequence[ClaimState]) -> bytes:
    """The file's bytes for ``claims``, as the kubelet writes them."""
    inner = _go_json(
        {
            "kind": KIND,
            "apiVersion": API_VERSION,
            "ClaimInfoStateList": [_claim_json(c) for c in claims],
        }
    )
    checksum = zlib.crc32(inner.encode())
    return _go_json({"Data": inner, "Checksum": checksum}).encode()


def _field(raw: Mapping[str, Any], name: str) -> Any:
    """A struct field's value as Go's decoder finds it: keys match the field's
    name regardless of case, and the last matching key wins."""
    found = None
    folded = name.casefold()
    for key, value in raw.items():
        if key == name or key.casefold() == folded:
            found = value
    return found


def _optional_strings(value: object, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptCheckpoint(f"{what} is not a list of strings")
    return tuple(value)


def _device(raw: object) -> Device:
    if not isinstance(raw, dict):
        raise CorruptCheckpoint("a device is not an object")
    share = _field(raw, "ShareID")
    if share is not None and not isinstance(share, str):
        raise CorruptCheckpoint("ShareID is not a string")
    return Device(
        pool_name=str(_field(raw, "PoolName") or ""),
        device_name=str(_field(raw, "DeviceName") or ""),
        share_id=share,
        request_names=_optional_strings(_field(raw, "RequestNames"), "RequestNames"),
        cdi_device_ids=_optional_strings(_field(raw, "CDIDeviceIDs"), "CDIDeviceIDs"),
    )


def _driver(raw: object) -> tuple[tuple[Device, ...], tuple[str, ...]]:
    """A driver's devices and the node operations it skips."""
    if raw is None:
        return (), ()
    if not isinstance(raw, dict):
        raise CorruptCheckpoint("a driver state is not an object")
    devices = tuple(_device(d) for d in (_field(raw, "Devices") or ()))
    skips = _optional_strings(_field(raw, "skipNodeOperations"), "skipNodeOperations")
    return devices, skips or ()


def _claim(raw: object) -> ClaimState:
    if not isinstance(raw, dict):
        raise CorruptCheckpoint("a claim entry is not an object")
    pods = _field(raw, "PodUIDs")
    drivers = _field(raw, "DriverState")
    if pods is not None and not isinstance(pods, dict):
        raise CorruptCheckpoint("PodUIDs is not an object")
    if drivers is not None and not isinstance(drivers, dict):
        raise CorruptCheckpoint("DriverState is not an object")
    # Map keys (pod uids, driver names) are data: matched exactly.
    states = {driver: _driver(state) for driver, state in (drivers or {}).items()}
    return ClaimState(
        claim_uid=str(_field(raw, "ClaimUID") or ""),
        claim_name=str(_field(raw, "ClaimName") or ""),
        namespace=str(_field(raw, "Namespace") or ""),
        pod_uids=None if pods is None else frozenset(pods),
        driver_state=None
        if drivers is None
        else {driver: devices for driver, (devices, _) in states.items()},
        skip_node_operations={driver: skips for driver, (_, skips) in states.items() if skips},
    )


def decode(blob: bytes) -> list[ClaimState]:
    """The claims in a checkpoint file's bytes; ``CorruptCheckpoint`` if it cannot be trusted."""
    try:
        outer = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptCheckpoint(f"not JSON: {err}") from err
    if not isinstance(outer, dict) or not isinstance(outer.get("Data"), str):
        raise CorruptCheckpoint("no Data string")
    data: str = outer["Data"]
    expected = zlib.crc32(data.encode())
    if outer.get("Checksum") != expected:
        raise CorruptCheckpoint(
            f"checkpoint is corrupted: checksum {outer.get('Checksum')} recorded, "
            f"{expected} computed"
        )
    try:
        inner = json.loads(data)
    except ValueError as err:
        raise CorruptCheckpoint(f"Data is not JSON: {err}") from err
    if not isinstance(inner, dict):
        raise CorruptCheckpoint("Data is not an object")
    listed = _field(inner, "ClaimInfoStateList")
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise CorruptCheckpoint("ClaimInfoStateList is not a list")
    return [_claim(entry) for entry in listed]


class Store:
    """The checkpoint file under a kubelet root dir: read it, replace it atomically."""

    def __init__(self, kubelet_dir: Path) -> None:
        self.path = kubelet_dir / FILE_NAME

    def load(self) -> list[ClaimState]:
        """The claims recorded; none when there is no file. A corrupt file raises."""
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            return decode(blob)
        except CorruptCheckpoint as err:
            raise CorruptCheckpoint(f"{self.path}: {err}") from err

    def save(self, claims: Sequence[ClaimState]) -> None:
        """Write, fsync, rename into place, fsync the directory: a crash leaves
        the old file or the new one, never a torn one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(f".{self.path.name}.tmp")
        with staging.open("wb") as stream:
            stream.write(encode(claims))
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(staging, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
