"""The host sysctls kubelets change, shared by every sandbox on the host.

A kubelet's container manager sets six sysctls of the machine it runs on
(``SYSCTLS``, its setupKernelTunables) when it starts. A sandbox's
fake-runtime and container nodes run their kubelets on the host (VM nodes'
kubelets set their guest's own), so they change the host's, and ``down``
must write back what was there before.

Two such sandboxes may run at once (a ``make demo`` beside a test run), so
there is one record of the originals for the host, not one per sandbox
(per sandbox, the second one saved the first one's kubelet values as the
originals and wrote them back last, leaving the host changed for good):
``LEDGER`` holds the values found before the first user, the users (their
sandbox directories) and the host's boot id. ``claim`` (before a sandbox
starts its first kubelet) records the values only when the ledger has no
user left, and adds its user; ``release`` (in ``down``, once the kubelets
stopped) removes its user and writes the values back only when no user is
left. A user whose sandbox runs no process any more (killed before its
``down``, which will never come) is dropped by the next ``claim`` or
``release``; the values it left are its kubelet's, so the recorded ones
stay the host's. A ledger from an earlier boot is forgotten: the host's
values are its own again.

Why share rather than refuse a second sandbox: nothing else the two share
is host-wide (each has its own namespaces, fabric, cgroups and loopback
ports), every kubelet wants the same values, and refusing would make the
demo fail while tests run. ``claim`` and ``release`` hold an exclusive lock
on ``LEDGER``'s lock file while they read and write it; the ledger is
written atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import state

__all__ = ["LEDGER", "SYSCTLS", "claim", "read", "release", "restore", "users"]

# Every one the kubelet's container manager sets (setupKernelTunables).
SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Read at each call (tests point them elsewhere).
LEDGER = Path("/run/kmm/sandbox-sysctls.json")
_PROC_SYS = Path("/proc/sys")
_BOOT_ID: Final = "kernel/random/boot_id"
_FORMAT: Final = 1


def read() -> dict[str, str]:
    """The host's values of ``SYSCTLS`` now."""
    return {name: (_PROC_SYS / name).read_text().strip() for name in SYSCTLS}


def restore(values: dict[str, str]) -> None:
    """Write back what ``read`` found (best effort per key; only where changed)."""
    for name, value in values.items():
        try:
            if (_PROC_SYS / name).read_text().strip() != value:
                (_PROC_SYS / name).write_text(value)
        except OSError:
            continue


def _boot_id() -> str:
    try:
        return (_PROC_SYS / _BOOT_ID).read_text().strip()
    except OSError:
        return ""


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LEDGER.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(LEDGER.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _load() -> dict[str, Any] | None:
    """The ledger of this boot, or None (none yet, another boot's, unreadable)."""
    try:
        document = json.loads(LEDGER.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        return None
    if document.get("bootId") != _boot_id():
        return None
    return document


def _save(document: dict[str, Any] | None) -> None:
    if document is None:
        LEDGER.unlink(missing_ok=True)
        return
    temporary = LEDGER.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(LEDGER)


def _running(user: str) -> bool:
    """Whether the sandbox in directory ``user`` still runs a process."""
    try:
        record = state.load(Path(user))
    except ValueError:
        return False
    return record is not None and bool(record.alive())


def users() -> list[str]:
    """The sandboxes holding the host's sysctls changed now (as the ledger says)."""
    document = _load()
    return list(document["users"]) if document else []


def claim(user: Path) -> None:
    """Sandbox ``user`` (its directory) is about to start kubelets on the
    host: the values as they are now are recorded unless another running
    sandbox recorded them first."""
    with _locked():
        document = _load()
        if document is None:
            document = {"format": _FORMAT, "bootId": _boot_id(), "values": read(), "users": []}
        others = [u for u in document["users"] if u != str(user) and _running(u)]
        document["users"] = [*others, str(user)]
        _save(document)


def release(user: Path) -> bool:
    """Sandbox ``user`` stopped its kubelets: the recorded values are written
    back when no other running sandbox holds them. Whether they were."""
    with _locked():
        document = _load()
        if document is None:
            return False
        left = [u for u in document["users"] if u != str(user) and _running(u)]
        if left:
            document["users"] = left
            _save(document)
            return False
        restore(document["values"])
        _save(None)
        return True
