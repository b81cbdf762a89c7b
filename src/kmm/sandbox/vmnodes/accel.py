"""Which accelerator VM nodes run on: KVM where it boots a node, else TCG.

``/dev/kvm`` existing proves little: under nested virtualization a Linux
guest may hang before its first console line, and a KVM without System
Management Mode cannot run the Secure Boot firmware at all (qemu says so and
exits). So ``auto`` boots the node image once under KVM, as nodes boot it
(same firmware, Secure Boot on or off), and takes KVM only if that boot
reaches userspace (the kernel's "Run /init as init process" on the serial
console) within ``PROBE_TIMEOUT``; the probe ends early when qemu exits or
reports a KVM internal error. The verdict is cached in
``<cache>/vm/accel.json`` under everything it depends on (the image, Secure
Boot, the host's kernel and qemu's version), so it is paid once.

``kvm`` and ``tcg`` are taken as asked (``kvm`` needs ``/dev/kvm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final, Literal

from kmm.sandbox import errors, processes
from kmm.sandbox.vmnodes import esp, images, machines, qemu

__all__ = ["PROBE_TIMEOUT", "Requested", "choose", "verdict_key"]

Requested = Literal["auto", "kvm", "tcg"]
PROBE_TIMEOUT: Final = 60.0
_USERSPACE: Final = b"Run /init as init process"
_KVM_FAILED: Final = (b"KVM internal error", b"not supported by this hypervisor")
_KVM: Final = Path("/dev/kvm")


def _qemu_version() -> str:
    result = subprocess.run(
        [qemu.binary(), "--version"], capture_output=True, text=True, check=False
    )
    return result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else "?"


def verdict_key(image: images.NodeImage, *, secure_boot: bool) -> str:
    """What a cached verdict holds for: this image, Secure Boot on or off,
    this host kernel, this qemu."""
    return " | ".join(
        (
            image.directory.name,
            f"secure-boot={'on' if secure_boot else 'off'}",
            os.uname().release,
            _qemu_version(),
        )
    )


def _cache(cache_dir: Path) -> Path:
    return cache_dir / "vm" / "accel.json"


def _cached(cache_dir: Path) -> dict[str, str]:
    try:
        loaded = json.loads(_cache(cache_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def _record(cache_dir: Path, key: str, verdict: str) -> None:
    path = _cache(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    verdicts = {**_cached(cache_dir), key: verdict}
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(verdicts, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)


async def _probe(image: images.NodeImage, *, secure_boot: bool, timeout: float) -> bool:
    """Boot ``image`` under KVM with no NIC; whether it reached userspace."""
    with tempfile.TemporaryDirectory(prefix="kmm-kvm-probe-") as work:
        machine = qemu.Machine(
            name="kmm-kvm-probe", directory=Path(work), accel="kvm", secure_boot=secure_boot
        )
        machines.prepare(
            machine,
            image,
            esp.NodeSettings(name="kmm-kvm-probe", mac="52:54:00:00:00:01"),
            kernel=image.kernels.default,
            key=None,
        )
        log = machine.directory / "qemu.log"
        process = processes.launch("kvm-probe", qemu.argv(machine), log=log)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    if _USERSPACE in machine.serial_log.read_bytes():
                        return True
                if not process.alive():
                    return False
                with contextlib.suppress(OSError):
                    if any(failure in log.read_bytes() for failure in _KVM_FAILED):
                        return False
                await asyncio.sleep(0.5)
            return False
        finally:
            await process.kill_async()


async def choose(
    requested: Requested,
    *,
    cache_dir: Path,
    image: images.NodeImage,
    secure_boot: bool,
    timeout: float = PROBE_TIMEOUT,
) -> qemu.Accel:
    """The accelerator for ``requested`` (see the module docstring)."""
    if requested == "tcg":
        return "tcg"
    if requested == "kvm":
        if not _KVM.exists():
            raise errors.SandboxError("--accel kvm: this host has no /dev/kvm")
        return "kvm"
    if not _KVM.exists():
        return "tcg"
    key = verdict_key(image, secure_boot=secure_boot)
    cached = _cached(cache_dir).get(key)
    if cached in ("kvm", "tcg"):
        return "kvm" if cached == "kvm" else "tcg"
    verdict: qemu.Accel = (
        "kvm" if await _probe(image, secure_boot=secure_boot, timeout=timeout) else "tcg"
    )
    _record(cache_dir, key, verdict)
    return verdict
