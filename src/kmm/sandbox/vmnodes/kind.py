"""The sandbox's VM nodes behind the node interface (``nodekinds.NodeKind``).

``plan`` lays out VM node ``j`` (``kmm-vm-<j>``) in ``<sandbox>/vms/<j>/``
with three host ports (its kubelet's, healthz, kube-proxy's health) and
place ``kubelet nodes + j`` on the fabric (``planning``: that layout, and
the ``Boot`` every node boots with, checked before anything starts). Its namespace (``attachments``)
is the guest's wire to the fabric: a tap bridged with the node's fabric link
(``fabric.attach_bridged``); its ports are published on the host's loopback
from the guest's node IP. ``start`` boots every node at once (``nodes``:
OVMF, shim, grub, Debian's signed kernel; Secure Boot on unless told
otherwise, the sandbox's signing key in its firmware), each with its
Kubernetes files and routes on its ESP (``kubernetes``), and returns once
every Node is Ready: the guest's own kubelet, containerd, runc, CNI and
kube-proxy, started by its systemd.

``stop`` stops qemu and removes what a node has on disk (its overlay, ESP
and firmware variables; its console log and records stay with the logs);
its tap goes with its namespace. ``reboot`` reboots a guest's OS for real
(onto another kernel when asked: grub's saved default) and waits until its
Node is Ready again on the new boot (the Node's ``bootID`` the guest's new
one, its ``kernelVersion`` the kernel it booted); ``restart`` is a reboot on
the same kernel. ``exec`` runs a command as root in a node's OS; ``status``
asks each guest its kernel, Secure Boot state and qemu's accelerator.

Timeouts: a boot under TCG takes about 30 s on a quiet machine and minutes
on a busy one, so a VM node waits at least ``BOOT_TIMEOUT`` whatever the
sandbox's start timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from kmm.kube import client, kubeconfigs, objects, resources
from kmm.sandbox import (
    addressing,
    errors,
    launching,
    networking,
    nodekinds,
    pki,
    processes,
    state,
)
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes
from kmm.sandbox.vmnodes import agent, esp, kubernetes, planning
from kmm.sandbox.vmnodes import nodes as vm

__all__ = [
    "BOOT_TIMEOUT",
    "KIND",
    "LABEL",
    "NODE_PREFIX",
    "VmNodes",
    "identities",
    "names",
    "of",
    "plan",
]

KIND: Final = "vm"
NODE_PREFIX: Final = "kmm-vm-"
# VM nodes carry it besides ``nodekinds.KUBELET_NODE_LABEL``.
LABEL: Final = "kmm.sandbox/vm"
BOOT_TIMEOUT: Final = 600.0
_TAP: Final = "kmmtap0"
# What a node has on disk that ``stop`` removes (``qemu.Machine`` names them).
_DISKS: Final = ("root.qcow2", "esp.img", "OVMF_VARS.fd", "qmp.sock", "qga.sock")
# The guest's own units, whose journal a failed start shows.
_UNITS: Final = ("kmm-containerd", "kmm-kubelet", "kmm-kube-proxy")


def names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{index}" for index in range(count)]


def identities(planned: Sequence[str]) -> list[pki.ClientIdentity]:
    """The client identities the guests' kubelets and kube-proxies authenticate with."""
    return [
        *(kubeletnodes.identity(name) for name in planned),
        *(containernodes.proxy_identity(name) for name in planned),
    ]


class VmNodes:
    """A sandbox's VM nodes (``nodekinds.NodeKind``)."""

    def __init__(
        self,
        record: state.SandboxState,
        planned: Sequence[planning.PlannedNode],
        *,
        boot: planning.Boot | None = None,
    ) -> None:
        self._record = record
        self._nodes = list(planned)
        self._boot = boot
        self._booted: list[vm.VmNode] = []

    @property
    def kind(self) -> str:
        return KIND

    @property
    def names(self) -> list[str]:
        return list(self._record.vm_nodes)

    def attachments(self) -> list[networking.Attachment]:
        return [
            networking.Attachment(
                name=node.name,
                index=node.index,
                published=(node.port, node.healthz_port, node.proxy_healthz_port),
                tap=_TAP,
            )
            for node in self._nodes
        ]

    def _node(self, name: str) -> planning.PlannedNode:
        for node in self._nodes:
            if node.name == name:
                return node
        raise errors.NotRunning(f"the sandbox in {self._record.directory} has no VM node {name}")

    def handle(self, name: str) -> vm.VmNode:
        """The running node ``name`` (its qemu process as the record has it now)."""
        found = vm.load(self._node(name).directory)
        process = self._record.launched[launching.find(self._record, f"vm/{name}")]
        return dataclasses.replace(found, process=process)

    def _files(self, node: planning.PlannedNode, starting: nodekinds.Starting) -> dict[str, bytes]:
        assert self._boot is not None
        credentials = starting.credentials
        kubelet = kubeletnodes.identity(node.name)
        proxy = containernodes.proxy_identity(node.name)
        return kubernetes.files(
            kubernetes.NodeFiles(
                name=node.name,
                index=node.index,
                api_port=starting.api_port,
                kubelet_port=node.port,
                healthz_port=node.healthz_port,
                proxy_healthz_port=node.proxy_healthz_port,
                labels={nodekinds.KUBELET_NODE_LABEL: "true", LABEL: "true"},
                ca_cert=credentials.ca_cert.read_bytes(),
                kubelet_cert=credentials.client_cert(kubelet).read_bytes(),
                kubelet_key=credentials.client_key(kubelet).read_bytes(),
                proxy_cert=credentials.client_cert(proxy).read_bytes(),
                proxy_key=credentials.client_key(proxy).read_bytes(),
                pause_archive=self._boot.pause_archive.read_bytes(),
            )
        )

    async def boot(self, starting: nodekinds.Starting) -> None:
        """Boot every node (see the module docstring); return once each
        guest's agent answers. Needs the network, not the API server:
        ``cluster.up`` boots them while the control plane starts."""
        boot = self._boot
        assert boot is not None, "only a planned kind boots"
        if not boot.pause_archive.is_file():
            raise errors.SandboxError(
                f"VM nodes need the pause image archive {boot.pause_archive} "
                "(`make test-images` writes build/images/pause.tar)"
            )
        indices = range(len(self._record.kubelet_nodes) + len(self._record.vm_nodes))
        for node in self._nodes:
            settings = esp.NodeSettings(
                name=node.name,
                mac=vm.mac_address(node.index),
                address=f"{node.address}/{addressing.FABRIC.prefixlen}",
                routes=planning.routes(node.index, indices),
                files=self._files(node, starting),
            )
            spec = vm.NodeSpec(
                name=node.name,
                directory=node.directory,
                settings=settings,
                kernel=boot.kernel,
                secure_boot=boot.secure_boot,
                accel=boot.accel,
                memory_mib=boot.memory_mib,
                tap=_TAP,
            )
            self._booted.append(
                await vm.start(
                    starting.launcher,
                    spec,
                    image=boot.image,
                    holder=starting.holder(node.name),
                    # Without Secure Boot nothing is verified: no key is enrolled.
                    key=boot.key if boot.secure_boot else None,
                    cache_dir=starting.cache_dir,
                )
            )
        # The guest's OS is up; whether its units are is its Node's business
        # (``start``), whose failure shows their journal.
        timeout = max(starting.timeout, BOOT_TIMEOUT)
        await asyncio.gather(*(node.wait_agent(timeout=timeout) for node in self._booted))

    async def start(self, starting: nodekinds.Starting) -> None:
        """``boot`` unless done, then wait until every Node is Ready."""
        if not self._booted:
            await self.boot(starting)
        timeout = max(starting.timeout, BOOT_TIMEOUT)
        try:
            async with client.Client(kubeconfigs.load(self._record.kubeconfig)) as api:
                await nodekinds.wait_ready(
                    api, self.names, timeout=timeout, label_selector=f"{LABEL}=true"
                )
        except TimeoutError as err:
            raise await self._failed(
                self._booted[0], f"{len(self._booted)} VM node(s) not Ready within {timeout:.0f} s"
            ) from err

    async def _failed(self, node: vm.VmNode, reason: str) -> errors.ComponentFailed:
        """What a node that does not become Ready says: its units' journal,
        written beside the sandbox's logs."""
        log = self._record.directory / "logs" / "vm" / f"{node.name}.journal.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            units = [argument for unit in _UNITS for argument in ("-u", unit)]
            found = await node.exec(["journalctl", "--no-pager", "-n", "200", *units], timeout=60)
            log.write_text(found.output)
        except errors.SandboxError as err:
            log.write_text(f"the guest did not answer: {err}\n")
        return errors.ComponentFailed(f"vm/{node.name}", reason, log, processes.log_tail(log))

    def stop(self) -> None:
        """See the module docstring."""
        launching.stop(self._record, {f"vm/{name}" for name in self.names}.__contains__)
        for node in self._nodes:
            for name in _DISKS:
                (node.directory / name).unlink(missing_ok=True)

    async def exec(self, name: str, argv: Sequence[str], *, timeout: float) -> agent.ExecResult:
        """Run ``argv`` as root in node ``name``'s own OS."""
        return await self.handle(name).exec(argv, timeout=timeout)

    async def reboot(
        self, name: str, *, kernel: str | None = None, timeout: float = BOOT_TIMEOUT
    ) -> vm.Status:
        """Reboot node ``name`` (onto ``kernel`` when given); its status once
        its Node is Ready on the new boot (see the module docstring)."""
        node = self.handle(name)
        rebooted = await node.reboot(kernel=kernel, timeout=timeout)
        try:
            async with client.Client(kubeconfigs.load(self._record.kubeconfig)) as api:
                await _wait_booted(api, name, rebooted, timeout=timeout)
        except TimeoutError as err:
            raise await self._failed(
                node,
                f"not Ready on kernel {rebooted.kernel} (boot {rebooted.boot_id}) within "
                f"{timeout:.0f} s of its reboot",
            ) from err
        return rebooted

    async def restart(self, name: str, *, timeout: float) -> None:
        await self.reboot(name, timeout=max(timeout, BOOT_TIMEOUT))

    async def status(self) -> list[nodekinds.NodeInfo]:
        found = []
        for node, described in zip(self._nodes, self.describe(), strict=True):
            try:
                live = await self.handle(node.name).status()
            except errors.SandboxError:
                found.append(described)
                continue
            found.append(
                dataclasses.replace(
                    described,
                    details=(
                        ("kernel", live.kernel),
                        ("Secure Boot", "on" if live.secure_boot else "off"),
                        ("accel", live.accel),
                    ),
                )
            )
        return found

    def describe(self) -> list[nodekinds.NodeInfo]:
        found = []
        for node in self._nodes:
            details: tuple[tuple[str, str], ...] = (
                ("kernel", "?"),
                ("Secure Boot", "?"),
                ("accel", "?"),
            )
            try:
                machine = vm.load(node.directory)
                details = (
                    ("kernel", machine.saved_kernel() + " (next boot)"),
                    ("Secure Boot", "on" if machine.machine.secure_boot else "off"),
                    ("accel", machine.machine.accel),
                )
            except (OSError, ValueError, KeyError, errors.SandboxError):
                pass
            found.append(
                nodekinds.NodeInfo(name=node.name, kind=KIND, address=node.address, details=details)
            )
        return found


def _booted(node: objects.RawObject, status: vm.Status) -> bool:
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return (
        info.get("bootID") == status.boot_id
        and info.get("kernelVersion") == status.kernel
        and nodekinds.schedulable_ready(node)
    )


async def _wait_booted(api: client.Client, name: str, status: vm.Status, *, timeout: float) -> None:
    """Return once Node ``name`` is Ready on the boot ``status`` describes;
    TimeoutError otherwise."""
    path = resources.NODES.path(name=name)

    async def poll() -> None:
        while True:
            found: Any = await api.request("GET", path)
            if _booted(found, status):
                return
            await asyncio.sleep(1.0)

    await asyncio.wait_for(poll(), timeout)


def plan(
    record: state.SandboxState,
    free: Sequence[int],
    *,
    boot: planning.Boot,
) -> VmNodes:
    """One node per name in ``record.vm_nodes``, each with three of the
    ``free`` host ports, placed on the fabric after the kubelet nodes."""
    first = len(record.kubelet_nodes)
    planned = []
    for position, name in enumerate(record.vm_nodes):
        port, healthz_port, proxy_port = free[3 * position : 3 * position + 3]
        node = planning.PlannedNode(
            name=name,
            index=first + position,
            directory=record.directory / "vms" / str(position),
            port=port,
            healthz_port=healthz_port,
            proxy_healthz_port=proxy_port,
        )
        node.save()
        planned.append(node)
    return VmNodes(record, planned, boot=boot)


def of(record: state.SandboxState) -> VmNodes | None:
    """A running sandbox's VM nodes (None when it has none)."""
    if not record.vm_nodes:
        return None
    found = []
    for position, _ in enumerate(record.vm_nodes):
        try:
            found.append(planning.PlannedNode.load(record.directory / "vms" / str(position)))
        except (OSError, ValueError, KeyError):
            continue
    return VmNodes(record, found)
