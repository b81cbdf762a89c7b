"""How qemu runs one VM node: its command line, and its control socket (QMP).

One vCPU (``-smp 1``: under TCG each vCPU is a host thread, and the control
plane needs the other core), nothing qemu would add by itself
(``-nodefaults``, ``-nic none``, no display, no user config), and:

- firmware in two flash chips: OVMF's code (read-only, shared) and the
  node's own variables (``firmware``); with Secure Boot the SMM build on a
  q35 with SMM on and the variables chip marked secure (what lets OVMF keep
  its authenticated variables from the OS);
- two virtio disks: the node's ESP (read-only to the guest: the host writes
  it) and the copy-on-write overlay of the image's root filesystem, both
  given a boot index, since OVMF connects only the devices the boot order
  names and grub could not find the root filesystem otherwise;
- the guest's one NIC: a tap the sandbox made in the node's network
  namespace, where qemu runs (``script=no``; never user-mode networking),
  with no option ROM (no network boot is ever tried);
- control files in the node's directory: ``qmp.sock`` (QMP), ``qga.sock``
  (the guest agent, ``agent``), ``serial.log`` (the console: firmware, grub,
  kernel, systemd);
- a virtio RNG, so the guest's entropy is not a reason to wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, Literal

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import firmware

__all__ = ["QEMU", "Machine", "Monitor", "argv", "binary", "monitor"]

QEMU: Final = "qemu-system-x86_64"
# TCG's translated-code cache: qemu 7.2 lets it grow to 1 GiB before it
# flushes, and a node's boot had filled 444 MiB of it (half of qemu's memory);
# a flush when 128 MiB are full costs a little retranslation.
TCG_CODE_CACHE_MIB: Final = 128
Accel = Literal["tcg", "kvm"]


@dataclasses.dataclass(frozen=True)
class Machine:
    """One VM's hardware and files."""

    name: str
    directory: Path
    accel: Accel
    secure_boot: bool
    memory_mib: int = 1024
    # The NIC: a tap in the namespace qemu runs in, and the guest's MAC on it;
    # no tap, no NIC (a probe boot).
    tap: str = ""
    mac: str = ""

    @property
    def variables(self) -> Path:
        return self.directory / "OVMF_VARS.fd"

    @property
    def esp(self) -> Path:
        return self.directory / "esp.img"

    @property
    def root(self) -> Path:
        return self.directory / "root.qcow2"

    @property
    def qmp_socket(self) -> Path:
        return self.directory / "qmp.sock"

    @property
    def agent_socket(self) -> Path:
        return self.directory / "qga.sock"

    @property
    def serial_log(self) -> Path:
        return self.directory / "serial.log"


def binary() -> str:
    """qemu's path; SandboxError saying how to get it when missing."""
    found = shutil.which(QEMU)
    if found is None:
        raise errors.SandboxError(
            f"VM nodes need {QEMU} (Debian's qemu-system-x86: `make vm-tools` installs it)"
        )
    return found


def argv(machine: Machine, *, code: Path | None = None, qemu: str | None = None) -> list[str]:
    """qemu's command line for ``machine`` (see the module docstring)."""
    code = code or firmware.code(secure_boot=machine.secure_boot)
    qemu = qemu or binary()
    secure = machine.secure_boot
    command = [
        qemu,
        "-name", machine.name,
        "-machine", "q35,smm=on" if secure else "q35,smm=off",
        "-accel", f"tcg,tb-size={TCG_CODE_CACHE_MIB}" if machine.accel == "tcg" else "kvm",
        *(["-global", "driver=cfi.pflash01,property=secure,value=on"] if secure else []),
        "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={code}",
        "-drive", f"if=pflash,format=raw,unit=1,file={machine.variables}",
        "-smp", "1",
        "-m", str(machine.memory_mib),
        "-nodefaults", "-no-user-config", "-display", "none", "-nic", "none",
        "-chardev", f"socket,id=qmp,path={machine.qmp_socket},server=on,wait=off",
        "-mon", "chardev=qmp,mode=control",
        "-chardev", f"file,id=serial,path={machine.serial_log}",
        "-serial", "chardev:serial",
        "-device", "virtio-serial-pci",
        "-chardev", f"socket,id=qga,path={machine.agent_socket},server=on,wait=off",
        "-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
        "-drive", f"if=none,id=esp,format=raw,readonly=on,file={machine.esp}",
        "-device", "virtio-blk-pci,drive=esp,bootindex=0",
        "-drive", f"if=none,id=root,format=qcow2,discard=unmap,file={machine.root}",
        "-device", "virtio-blk-pci,drive=root,bootindex=1",
        "-device", "virtio-rng-pci",
        "-device", "virtio-balloon-pci,free-page-reporting=on",
    ]  # fmt: skip
    if machine.tap:
        command += [
            "-netdev", f"tap,id=net0,ifname={machine.tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=net0,mac={machine.mac},romfile=",
        ]  # fmt: skip
    return command


class Monitor:
    """A QMP session: ``execute`` sends a command and returns its result,
    skipping the events in between."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        self._writer.write(json.dumps(message).encode() + b"\n")
        await self._writer.drain()
        while True:
            line = await self._reader.readline()
            if not line:
                raise errors.SandboxError(f"QMP closed its socket during {command}")
            answer = json.loads(line)
            if "error" in answer:
                raise errors.SandboxError(f"QMP {command}: {answer['error'].get('desc')}")
            if "return" in answer:
                return answer["return"]

    async def human(self, command_line: str) -> str:
        """An HMP command through QMP (``info network``...); its text."""
        return str(await self.execute("human-monitor-command", {"command-line": command_line}))


@contextlib.asynccontextmanager
async def monitor(socket: Path, *, timeout: float = 10.0) -> AsyncIterator[Monitor]:
    """A QMP session on ``socket``, capabilities negotiated."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        async with asyncio.timeout(timeout):
            greeting = json.loads(await reader.readline())
            if "QMP" not in greeting:
                raise errors.SandboxError(f"{socket} is not a QMP socket: {greeting}")
            session = Monitor(reader, writer)
            await session.execute("qmp_capabilities")
        yield session
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
