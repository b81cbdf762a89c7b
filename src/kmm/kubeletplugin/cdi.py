"""CDI spec files for prepared claims.

One spec file per prepared claim, ``<vendor>-<class>_<claim uid>.json`` under
the CDI directory, holding one CDI device per allocated device, named
``<claim uid>-<index of the allocation result>``: the container runtime then
injects ``vendor/class=<uid>-<i>``. Putting the claim UID in the device name
keeps two claims on the same physical device apart and lets
``claim_of_cdi_device`` map a container's CDI device back to its claim.

Every name is validated with CDI's own charsets before it is written, and the
spec's path is checked to sit directly in the CDI directory: a claim UID comes
from outside and must never become a path component unchecked. Files are
written atomically (``files.write_atomically``) with the minimum
``cdiVersion`` their content needs, so older runtimes accept them.

Specs are not fsynced: the checkpoint holds every prepared claim's edits, and
the plugin checks a prepared claim's spec against them (``is_current``) and
rewrites it when a crash or a reboot lost or tore it; on a real node the
directory is on a tmpfs anyway. ``remove_others`` clears specs whose claim
the checkpoint no longer holds (an unprepare cut short after its commit).

The spec content (``ContainerEdits``) comes from the policy; this module does
not know what a device is.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from kmm.kubeletplugin import claims, errors, files

__all__ = [
    "CLAIM_CLASS",
    "ContainerEdits",
    "DeviceNode",
    "Mount",
    "SpecDir",
    "claim_of_cdi_device",
    "container_claims",
    "minimum_version",
    "qualified_name",
]

CLAIM_CLASS = "claim"

_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_CLAIM_DEVICE = re.compile(r"^(?P<uid>[a-z0-9][a-z0-9-]*[a-z0-9])-(?P<index>[0-9]+)$")


class DeviceNode(TypedDict):
    path: str
    hostPath: NotRequired[str]
    type: NotRequired[str]
    major: NotRequired[int]
    minor: NotRequired[int]
    permissions: NotRequired[str]


class Mount(TypedDict):
    hostPath: str
    containerPath: str
    options: NotRequired[list[str]]
    type: NotRequired[str]


class ContainerEdits(TypedDict, total=False):
    """CDI ``containerEdits``: what the runtime adds to a container."""

    env: list[str]
    deviceNodes: list[DeviceNode]
    mounts: list[Mount]
    additionalGIDs: list[int]


def validate_vendor(vendor: str) -> None:
    if not _VENDOR.match(vendor):
        raise errors.CDIError(f"invalid CDI vendor name {vendor!r}")


def validate_class(cls: str) -> None:
    if not _CLASS.match(cls):
        raise errors.CDIError(f"invalid CDI class name {cls!r}")


def validate_device(name: str) -> None:
    if not _DEVICE.match(name):
        raise errors.CDIError(f"invalid CDI device name {name!r}")


def qualified_name(vendor: str, cls: str, device: str) -> str:
    """``vendor/class=device``, each part validated."""
    validate_vendor(vendor)
    validate_class(cls)
    validate_device(device)
    return f"{vendor}/{cls}={device}"


def claim_device_name(uid: claims.ClaimUID, index: int) -> str:
    return f"{uid}-{index}"


def claim_of_cdi_device(
    qualified: str, *, cls: str = CLAIM_CLASS
) -> tuple[claims.DriverName, claims.ClaimUID, int] | None:
    """The driver, claim UID and allocation-result index of a claim's CDI device.

    ``None`` for any other device (another class, or not a claim device name).
    """
    kind, sep, name = qualified.partition("=")
    vendor, slash, device_class = kind.partition("/")
    if not sep or not slash or device_class != cls or not _VENDOR.match(vendor):
        return None
    match = _CLAIM_DEVICE.match(name)
    if match is None:
        return None
    return (
        claims.DriverName(vendor),
        claims.ClaimUID(match["uid"]),
        int(match["index"]),
    )


def container_claims(
    cdi_device_ids: Iterable[str], driver: str, *, cls: str = CLAIM_CLASS
) -> dict[claims.ClaimUID, list[int]]:
    """The claims of ``driver`` a container holds, with the result indexes of each.

    A container that names only some requests of a claim holds only the
    results of those, so the indexes come from its own CDI devices.
    """
    held: dict[claims.ClaimUID, list[int]] = {}
    for qualified in cdi_device_ids:
        parsed = claim_of_cdi_device(qualified, cls=cls)
        if parsed is None or parsed[0] != driver:
            continue
        indexes = held.setdefault(parsed[1], [])
        if parsed[2] not in indexes:
            indexes.append(parsed[2])
    for indexes in held.values():
        indexes.sort()
    return held


# (version, predicate over the spec) from newest to oldest; the first match
# is the minimum version a runtime must understand to accept the spec. They
# follow the CDI library's own checks (specs-go version.go): containerd
# refuses a spec that declares less than it needs ("the spec version must be
# at least v0.5.0"), and its devices are then unresolvable.
def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The spec's own container edits and each device's."""
    return [spec.get("containerEdits") or {}] + [
        device.get("containerEdits") or {} for device in spec.get("devices", [])
    ]


def _needs_070(spec: Mapping[str, Any]) -> bool:
    return any(edits.get("additionalGIDs") for edits in _all_edits(spec))


def _needs_060(spec: Mapping[str, Any]) -> bool:
    # Annotations, or a dot in the class of the kind.
    return (
        "annotations" in spec
        or any("annotations" in d for d in spec.get("devices", []))
        or "." in str(spec.get("kind", "")).partition("/")[2]
    )


def _needs_050(spec: Mapping[str, Any]) -> bool:
    # Device names starting with a digit, and a device node's hostPath.
    return any(device["name"][:1].isdigit() for device in spec.get("devices", [])) or any(
        node.get("hostPath") for edits in _all_edits(spec) for node in edits.get("deviceNodes", [])
    )


def _needs_040(spec: Mapping[str, Any]) -> bool:
    # A mount's type.
    return any(mount.get("type") for edits in _all_edits(spec) for mount in edits.get("mounts", []))


_VERSION_RULES = (
    ("0.7.0", _needs_070),
    ("0.6.0", _needs_060),
    ("0.5.0", _needs_050),
    ("0.4.0", _needs_040),
)
_BASE_VERSION = "0.3.0"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The oldest ``cdiVersion`` that can express ``spec``."""
    for version, needs in _VERSION_RULES:
        if needs(spec):
            return version
    return _BASE_VERSION


class SpecDir:
    """The CDI spec directory, holding one spec file per prepared claim."""

    def __init__(self, root: pathlib.Path, *, vendor: str, cls: str = CLAIM_CLASS) -> None:
        validate_vendor(vendor)
        validate_class(cls)
        self.root = root
        self.vendor = vendor
        self.cls = cls

    def path_of(self, uid: claims.ClaimUID) -> pathlib.Path:
        """The spec file of a claim, refusing any UID that is not a plain name."""
        validate_device(uid)
        path = self.root / f"{self.vendor}-{self.cls}_{uid}.json"
        if path.parent != self.root or "/" in uid or uid in (".", ".."):
            raise errors.CDIError(f"claim UID {uid!r} would leave the CDI directory")
        return path

    def device_ids(self, uid: claims.ClaimUID, count: int) -> list[str]:
        return [
            qualified_name(self.vendor, self.cls, claim_device_name(uid, i)) for i in range(count)
        ]

    def render(self, uid: claims.ClaimUID, edits: Sequence[ContainerEdits]) -> dict[str, Any]:
        devices = []
        for index, device_edits in enumerate(edits):
            name = claim_device_name(uid, index)
            validate_device(name)
            devices.append({"name": name, "containerEdits": dict(device_edits)})
        spec: dict[str, Any] = {"kind": f"{self.vendor}/{self.cls}", "devices": devices}
        return {"cdiVersion": minimum_version(spec), **spec}

    def content(self, uid: claims.ClaimUID, edits: Sequence[ContainerEdits]) -> bytes:
        # Compact: with ``indent`` json falls back to its pure-Python encoder,
        # which cost more than the file's write (a spec per claim prepared).
        return json.dumps(self.render(uid, edits), sort_keys=True, separators=(",", ":")).encode()

    def write(self, uid: claims.ClaimUID, edits: Sequence[ContainerEdits]) -> list[str]:
        """Write the claim's spec atomically and return its qualified device ids."""
        path = self.path_of(uid)
        data = self.content(uid, edits)
        try:
            files.write_atomically(path, data, mode=0o644, sync=files.Sync.NONE, parent_mode=0o755)
        except OSError as err:
            raise errors.CDIError(f"cannot write CDI spec {path}: {err}") from err
        return self.device_ids(uid, len(edits))

    def is_current(self, uid: claims.ClaimUID, edits: Sequence[ContainerEdits]) -> bool:
        """Whether the claim's spec file holds exactly what ``write`` would write."""
        try:
            return self.path_of(uid).read_bytes() == self.content(uid, edits)
        except OSError:
            return False

    def remove(self, uid: claims.ClaimUID) -> bool:
        return files.remove(self.path_of(uid), durable=False)

    def remove_others(self, keep: Iterable[str]) -> list[pathlib.Path]:
        """Remove this vendor's claim specs whose UID is not in ``keep``; the removed."""
        kept = set(keep)
        prefix = f"{self.vendor}-{self.cls}_"
        removed = []
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return []
        for path in entries:
            name = path.name
            if not (name.startswith(prefix) and name.endswith(".json")):
                continue
            if name[len(prefix) : -len(".json")] not in kept and files.remove(path, durable=False):
                removed.append(path)
        return removed
