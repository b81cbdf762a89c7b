"""What a sandbox's VM nodes will be, decided and checked before anything starts.

``Boot`` is how every VM node boots: the node image (``find_image``: built
by ``make vm-image``, never downloaded), the kernel booted first
(``check_kernel``), Secure Boot, the accelerator asked for
(``requested_accel``), the sandbox's module signing key (``signing_key``,
``<dir>/secure-boot/``) and the pause image archive. ``check_directory``
refuses a sandbox dir too deep for the nodes' control sockets, or a host
without qemu or the firmware, before anything starts.

``PlannedNode`` is one node's place: its name, its index on the fabric, its
directory and its three host ports, recorded in that directory
(``vmnode.json``) so a running sandbox's nodes are found again; ``routes``
are the guest's routes to the Service network and the other nodes' pods.

Limits: checks and layout only. Nothing here starts, boots or stops a
node, nor reads Kubernetes objects (``kind`` does); the ``ValueError``
messages name the ``kmm sandbox up`` flags they come from.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from kmm.sandbox import addressing, errors
from kmm.sandbox.vmnodes import accel, firmware, images, kernels, qemu
from kmm.sandbox.vmnodes import nodes as vm

__all__ = [
    "Boot",
    "PlannedNode",
    "check_directory",
    "check_kernel",
    "find_image",
    "requested_accel",
    "routes",
    "signing_key",
    "signing_key_path",
]

_RECORD: Final = "vmnode.json"


def find_image(cache_dir: Path) -> images.NodeImage:
    """The node image built for the recorded kernels; SandboxError saying
    how to build it (no sandbox downloads anything)."""
    chosen = kernels.load(cache_dir)
    found = images.find(cache_dir, chosen) if chosen is not None else None
    if found is None:
        raise errors.SandboxError(
            "VM nodes boot the VM node image, which is not built: run `make vm-image` "
            "(as root; it downloads Debian's packages, a few minutes once)"
        )
    return found


def signing_key(directory: Path) -> firmware.SigningKey:
    """The sandbox's module signing key, ``<dir>/secure-boot/signing.{key,crt}``,
    made now unless there."""
    return firmware.signing_key(directory, common_name="kmm sandbox module signing key")


def signing_key_path(directory: Path) -> firmware.SigningKey:
    """Where ``signing_key`` keeps it (it may not be made yet)."""
    return firmware.SigningKey(directory / "secure-boot")


def check_kernel(image: images.NodeImage, kernel: str) -> str:
    """The kernel nodes boot first: ``kernel``, or the image's default when
    empty; ValueError naming ``--node-kernel`` when the image has no such one."""
    if not kernel:
        return image.kernels.default
    if kernel not in image.kernels.versions:
        raise ValueError(
            f"--node-kernel {kernel!r} is not a kernel of the VM node image "
            f"(it has {', '.join(image.kernels.versions)})"
        )
    return kernel


def requested_accel(text: str) -> accel.Requested:
    """``auto``, ``kvm`` or ``tcg``; ValueError naming ``--accel`` otherwise."""
    if text == "auto":
        return "auto"
    if text == "kvm":
        return "kvm"
    if text == "tcg":
        return "tcg"
    raise ValueError(f"--accel must be one of auto, kvm, tcg, not {text!r}")


# The longest control socket under a sandbox dir (``vm.start`` checks each).
_LONGEST_SOCKET: Final = "vms/000/qmp.sock"


def check_directory(directory: Path) -> None:
    """Refuse a sandbox dir too deep for the VM nodes' control sockets, or
    a host without qemu or the firmware, before anything starts."""
    longest = len(str(directory / _LONGEST_SOCKET).encode())
    if longest > vm.SOCKET_PATH_MAX:
        raise errors.SandboxError(
            f"a sandbox with VM nodes needs a shorter directory than {directory}: its "
            f"nodes' control sockets would take {longest} characters, unix sockets allow "
            f"{vm.SOCKET_PATH_MAX} (try --dir /tmp/kmm)"
        )
    qemu.binary()


@dataclasses.dataclass(frozen=True)
class Boot:
    """How every VM node of a sandbox boots: the image, the kernel first
    booted, Secure Boot on or off, the accelerator asked for, the key the
    firmware trusts, the pause image archive, the guest's memory."""

    image: images.NodeImage
    kernel: str
    secure_boot: bool
    accel: accel.Requested
    key: firmware.SigningKey
    pause_archive: Path
    memory_mib: int = 1024


@dataclasses.dataclass(frozen=True)
class PlannedNode:
    """One VM node's name, place on the fabric, directory and host ports."""

    name: str
    index: int
    directory: Path
    port: int
    healthz_port: int
    proxy_healthz_port: int

    @property
    def address(self) -> str:
        return str(addressing.node_address(self.index))

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        document = {
            "name": self.name,
            "index": self.index,
            "port": self.port,
            "healthzPort": self.healthz_port,
            "proxyHealthzPort": self.proxy_healthz_port,
        }
        (self.directory / _RECORD).write_text(json.dumps(document, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> PlannedNode:
        document = json.loads((directory / _RECORD).read_text())
        return cls(
            name=str(document["name"]),
            index=int(document["index"]),
            directory=directory,
            port=int(document["port"]),
            healthz_port=int(document["healthzPort"]),
            proxy_healthz_port=int(document["proxyHealthzPort"]),
        )


def routes(index: int, indices: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """The guest's routes, as a container node's namespace has them: the
    Service network on its link (kube-proxy's DNAT applies after routing),
    every other node's pods via that node."""
    return (
        (str(addressing.SERVICE_NETWORK), ""),
        *(
            (str(addressing.pod_subnet(other)), str(addressing.node_address(other)))
            for other in indices
            if other != index
        ),
    )
