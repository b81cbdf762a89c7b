"""One VM node: start it, run commands in its OS, reboot it, stop it.

``start`` lays out the node's files (``machines``), makes the tap its NIC
plugs into inside the node's network namespace (made and held by the
sandbox: ``namespaces``; connecting the tap to anything is the caller's
business), picks the accelerator (``accel``) and launches qemu in that
namespace through the sandbox's launcher, which records it like every other
component. The returned ``VmNode`` is the handle the rest of the sandbox and
the tests use; ``load`` finds it again from the node's directory
(``node.json``).

A started node is ready once its guest agent answers and systemd says the
boot finished (``wait_ready``): the agent starts early, the node's address
comes later.
``reboot`` reboots the guest's OS (the qemu process stays), first making
another kernel grub's saved default when asked; it returns once the agent
answers from a new boot (the kernel's boot id changed) that finished. ``status`` says what
the node runs: its kernel, Secure Boot and lockdown as its kernel reports
them, and qemu's accelerator.

Limits: one NIC; nothing here makes the node a Kubernetes node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

from kmm.sandbox import errors, namespaces, processes
from kmm.sandbox.vmnodes import accel, agent, esp, firmware, images, kernels, machines, qemu

__all__ = [
    "SOCKET_PATH_MAX",
    "Launcher",
    "NodeSpec",
    "Status",
    "VmNode",
    "load",
    "mac_address",
    "start",
]

_RECORD: Final = "node.json"
# sockaddr_un's sun_path holds 108 bytes with its terminating NUL.
SOCKET_PATH_MAX: Final = 107
# systemd's state once its boot finished (``degraded``: a unit failed).
_BOOTED: Final = ("running", "degraded")
_SECURE_BOOT_VARIABLE: Final = (
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
)
# One command, one agent round: the kernel, this boot's id, lockdown, and the
# SecureBoot variable's bytes (4 of attributes, then the value).
_STATUS_SCRIPT: Final = (
    "uname -r; cat /proc/sys/kernel/random/boot_id; "
    "cat /sys/kernel/security/lockdown 2>/dev/null || echo unknown; "
    f"od -An -tu1 {_SECURE_BOOT_VARIABLE} 2>/dev/null || echo none"
)


class Launcher(namespaces.Launcher, Protocol):
    """What starts qemu: the sandbox's launcher, which records it."""


def mac_address(index: int) -> str:
    """The MAC of VM node ``index``'s NIC (locally administered, qemu's
    prefix)."""
    if not 0 <= index < 1 << 16:
        raise ValueError(f"VM node index {index} is out of range")
    return f"52:54:00:fa:{index >> 8:02x}:{index & 0xFF:02x}"


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What to start: the node's name and directory, its settings (which
    carry its MAC), the kernel it boots first, Secure Boot on or off, the
    accelerator asked for, its memory and the tap's name in its namespace."""

    name: str
    directory: Path
    settings: esp.NodeSettings
    kernel: str
    secure_boot: bool = True
    accel: accel.Requested = "auto"
    memory_mib: int = 1024
    tap: str = "kmmtap0"
    kernel_arguments: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Status:
    """What a running node reports of itself."""

    kernel: str
    boot_id: str
    secure_boot: bool
    lockdown: str
    accel: str


@dataclasses.dataclass(frozen=True)
class VmNode:
    """A started node (see the module docstring)."""

    machine: qemu.Machine
    image: images.NodeImage
    process: processes.Process
    holder: namespaces.Holder

    @property
    def name(self) -> str:
        return self.machine.name

    @property
    def directory(self) -> Path:
        return self.machine.directory

    def alive(self) -> bool:
        return self.process.alive()

    def rss_bytes(self) -> int:
        """qemu's resident memory (guest RAM it touched, its own, TCG's code cache)."""
        return self.process.rss_bytes()

    async def wait_agent(self, *, timeout: float = 600.0) -> None:
        """Return once the guest agent answers (early in the guest's boot);
        SandboxError with the serial console's last lines otherwise."""
        try:
            await agent.wait(self.machine.agent_socket, timeout=timeout, alive=self.alive)
        except agent.AgentUnavailable as err:
            qemu_state = "running" if self.alive() else "exited"
            raise errors.SandboxError(
                f"VM node {self.name}'s guest agent did not answer within {timeout:.0f} s "
                f"(qemu {qemu_state}); its console ({self.machine.serial_log}) ends:\n"
                + processes.log_tail(self.machine.serial_log)
            ) from err

    async def wait_ready(self, *, timeout: float = 600.0) -> str:
        """Return once the guest agent answers and the OS finished booting
        (systemd's state: ``running``, or ``degraded`` when a unit failed);
        SandboxError with the serial console's last lines when that does not
        happen in ``timeout`` seconds or qemu exits.

        systemd is asked once a second in a session of its own, not with
        ``--wait`` in one: the agent's socket takes one client at a time, and
        others (``kmm sandbox node exec``) may reach the node meanwhile."""
        deadline = time.monotonic() + timeout
        try:
            await agent.wait(self.machine.agent_socket, timeout=timeout, alive=self.alive)
            # The agent starts early; the node's address and routes come later.
            while True:
                try:
                    found = await self.exec(["systemctl", "is-system-running"], timeout=60)
                except agent.AgentUnavailable:
                    if not self.alive():
                        raise
                else:
                    state = found.stdout.decode().strip()
                    if state in _BOOTED:
                        return state
                if time.monotonic() > deadline:
                    raise TimeoutError
                await asyncio.sleep(1.0)
        except (agent.AgentUnavailable, TimeoutError) as err:
            qemu_state = "running" if self.alive() else "exited"
            raise errors.SandboxError(
                f"VM node {self.name} is not exec-ready after {timeout:.0f} s "
                f"(qemu {qemu_state}); its console ({self.machine.serial_log}) ends:\n"
                + processes.log_tail(self.machine.serial_log)
            ) from err

    async def exec(self, argv: Sequence[str], *, timeout: float = 300.0) -> agent.ExecResult:
        """Run ``argv`` as root in the node's OS (not in a container)."""
        async with agent.session(self.machine.agent_socket) as session:
            return await session.execute(argv, timeout=timeout)

    async def write_file(self, path: str, content: bytes) -> None:
        """Write a file in the node's OS, as root."""
        async with agent.session(self.machine.agent_socket) as session:
            await session.write_file(path, content)

    async def status(self) -> Status:
        result = await self.exec(["/bin/sh", "-c", _STATUS_SCRIPT], timeout=60)
        lines = result.stdout.decode().splitlines()
        if result.exit_code != 0 or len(lines) < 4:
            raise errors.SandboxError(f"VM node {self.name}'s status: {result.output.strip()}")
        kernel, boot_id, lockdown, variable = lines[:4]
        secure_boot = variable.split()[-1:] == ["1"]
        async with qemu.monitor(self.machine.qmp_socket) as monitor:
            kvm = await monitor.execute("query-kvm")
        return Status(
            kernel=kernel.strip(),
            boot_id=boot_id.strip(),
            secure_boot=secure_boot,
            lockdown=lockdown.strip(),
            accel="kvm" if kvm.get("enabled") else "tcg",
        )

    async def _boot_id(self) -> str:
        result = await self.exec(["cat", "/proc/sys/kernel/random/boot_id"], timeout=60)
        return result.stdout.decode().strip()

    def saved_kernel(self) -> str:
        """The kernel grub boots next."""
        return esp.saved_kernel(self.machine.esp)

    async def reboot(self, *, kernel: str | None = None, timeout: float = 600.0) -> Status:
        """Reboot the node's OS, onto ``kernel`` when given (grub's saved
        default: it stays the node's kernel for later boots); its status once
        exec-ready on the new boot."""
        if kernel is not None:
            self.image.kernels.require(kernel)
        before = await self._boot_id()
        if kernel is not None:
            esp.set_kernel(self.machine.esp, self.image, kernel)
        async with agent.session(self.machine.agent_socket) as session:
            await session.reboot()
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise errors.SandboxError(f"VM node {self.name}'s qemu exited during a reboot")
            try:
                if await self._boot_id() not in ("", before):
                    await self.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
                    return await self.status()
            except agent.AgentUnavailable:
                pass
            if time.monotonic() > deadline:
                raise errors.SandboxError(
                    f"VM node {self.name} did not come back from a reboot in {timeout:.0f} s; "
                    "its console ends:\n" + processes.log_tail(self.machine.serial_log)
                )
            await asyncio.sleep(1.0)

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Stop qemu (the guest is powered off, not shut down: its disk is an
        overlay only it writes, and ext4's journal covers the rest)."""
        await self.process.stop_async(grace_seconds=grace_seconds)


def _save(node: VmNode) -> None:
    machine = node.machine
    document = {
        "name": machine.name,
        "accel": machine.accel,
        "secureBoot": machine.secure_boot,
        "memoryMiB": machine.memory_mib,
        "tap": machine.tap,
        "mac": machine.mac,
        "image": str(node.image.directory),
        "kernels": list(node.image.kernels.versions),
        "suite": node.image.kernels.suite,
        "rootUuid": node.image.root_uuid,
        "holder": node.holder.pid,
        "process": {
            "pid": node.process.pid,
            "startTicks": node.process.start_ticks,
            "log": str(node.process.log),
            "argv": list(node.process.argv),
        },
    }
    record = machine.directory / _RECORD
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(record)


def load(directory: Path) -> VmNode:
    """The node ``start`` recorded in ``directory``."""
    document = json.loads((directory / _RECORD).read_text())
    machine = qemu.Machine(
        name=document["name"],
        directory=directory,
        accel="kvm" if document["accel"] == "kvm" else "tcg",
        secure_boot=bool(document["secureBoot"]),
        memory_mib=int(document["memoryMiB"]),
        tap=document["tap"],
        mac=document["mac"],
    )
    recorded = document["process"]
    return VmNode(
        machine=machine,
        image=images.NodeImage(
            directory=Path(document["image"]),
            kernels=kernels.KernelList(
                versions=tuple(document["kernels"]), suite=document["suite"]
            ),
            root_uuid=document["rootUuid"],
        ),
        process=processes.Process(
            name=f"vm/{machine.name}",
            pid=int(recorded["pid"]),
            start_ticks=int(recorded["startTicks"]),
            log=Path(recorded["log"]),
            argv=tuple(recorded["argv"]),
        ),
        holder=namespaces.Holder(pid=int(document["holder"])),
    )


def _make_tap(holder: namespaces.Holder, tap: str) -> None:
    """The tap qemu opens, in the node's namespace, up (made once)."""
    links = namespaces.run_in(holder, ["ip", "-o", "link", "show"])
    if f" {tap}:" not in links:
        namespaces.run_in(holder, ["ip", "tuntap", "add", "dev", tap, "mode", "tap"])
    namespaces.run_in(holder, ["ip", "link", "set", tap, "up"])


async def start(
    launcher: Launcher,
    spec: NodeSpec,
    *,
    image: images.NodeImage,
    holder: namespaces.Holder,
    key: firmware.SigningKey | None,
    cache_dir: Path,
) -> VmNode:
    """Start the node ``spec`` describes, in ``holder``'s network namespace,
    its firmware trusting ``key`` (see the module docstring). Returns at once:
    ``wait_ready`` waits for its OS."""
    image.kernels.require(spec.kernel)
    longest = spec.directory / "qmp.sock"
    if len(str(longest).encode()) > SOCKET_PATH_MAX:
        raise errors.SandboxError(
            f"VM node directory {spec.directory} is too long for its control sockets "
            f"({SOCKET_PATH_MAX} bytes at most for {longest})"
        )
    chosen = await accel.choose(
        spec.accel, cache_dir=cache_dir, image=image, secure_boot=spec.secure_boot
    )
    machine = qemu.Machine(
        name=spec.name,
        directory=spec.directory,
        accel=chosen,
        secure_boot=spec.secure_boot,
        memory_mib=spec.memory_mib,
        tap=spec.tap,
        mac=spec.settings.mac,
    )
    machines.prepare(
        machine,
        image,
        spec.settings,
        kernel=spec.kernel,
        key=key,
        kernel_arguments=spec.kernel_arguments,
    )
    for stale in (machine.qmp_socket, machine.agent_socket):
        stale.unlink(missing_ok=True)
    _make_tap(holder, spec.tap)
    process = launcher.launch(
        f"vm/{spec.name}",
        [*namespaces.nsenter(holder, mount=False), *qemu.argv(machine)],
        health_url="",
    )
    node = VmNode(machine=machine, image=image, process=process, holder=holder)
    _save(node)
    return node
