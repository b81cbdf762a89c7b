"""A VM node's own ESP: its boot files and its settings, written by the host.

Each node boots from a small FAT disk of its own (``mkfs.vfat``, files put
with ``mcopy``: the host never mounts it): shim as ``EFI/BOOT/BOOTX64.EFI``,
grub beside it, ``EFI/debian/grub.cfg`` and ``grubenv`` (``grub``), and
under ``kmm/`` what the node's OS reads at boot (``guest/node-setup``):
``node.env`` (its name, MAC, address and routes) and any further files the
sandbox gives it (a kubelet configuration...). Making one takes a fraction
of a second, so it is made per node rather than cached.

The guest mounts it read-only at boot, copies ``kmm/`` out and unmounts it,
so the host may rewrite a file while the node runs: ``set_kernel`` changes
grub's saved default before a reboot.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import grub, images

__all__ = ["LABEL", "NodeSettings", "make", "node_env", "saved_kernel", "set_kernel"]

LABEL: Final = "KMMNODE"
_SIZE_KIB: Final = 16 * 1024
_GRUB_DIR: Final = "::/EFI/debian"
_FILE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NODE_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_MAC: Final = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """What a node's OS takes from its ESP: its host name, the MAC of the NIC
    its address goes on, that address (``10.253.0.10/24``; empty for none),
    routes (destination, gateway; an empty gateway is a route on the link)
    and further files for ``/run/kmm/node/``."""

    name: str
    mac: str
    address: str = ""
    routes: tuple[tuple[str, str], ...] = ()
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)


def node_env(settings: NodeSettings) -> str:
    """``node.env``, a file the guest's shell sources. ValueError naming a
    field that is not what it must be (the values reach a root shell)."""
    if not _NODE_NAME.fullmatch(settings.name):
        raise ValueError(f"node name {settings.name!r} is not a DNS label")
    if not _MAC.fullmatch(settings.mac):
        raise ValueError(f"MAC {settings.mac!r} is not six lower-case hex pairs")
    if settings.address:
        ipaddress.IPv4Interface(settings.address)
    routes = []
    for destination, gateway in settings.routes:
        ipaddress.IPv4Network(destination)
        if gateway:
            ipaddress.IPv4Address(gateway)
        routes.append(f"{destination}={gateway}" if gateway else destination)
    for name in settings.files:
        if not _FILE_NAME.fullmatch(name) or name == "node.env":
            raise ValueError(f"node file name {name!r} is not a plain file name (or is node.env)")
    values = {
        "KMM_NODE_NAME": settings.name,
        "KMM_NODE_MAC": settings.mac,
        "KMM_NODE_ADDRESS": settings.address,
        "KMM_NODE_ROUTES": " ".join(routes),
    }
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())


def _mtools(argv: list[str]) -> None:
    # The image has no partition table and no drive letter in mtools.conf:
    # -i names it, and the geometry check would refuse a plain mkfs.vfat image.
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise errors.SandboxError(
            f"`{shlex.join(argv)}` failed: {result.stderr.strip() or result.stdout.strip()}"
        )


def make(
    path: Path,
    image: images.NodeImage,
    settings: NodeSettings,
    *,
    kernel: str,
    kernel_arguments: tuple[str, ...] = (),
) -> None:
    """Write the node's ESP to ``path``: boot files of ``image``, a grub.cfg
    for its kernels, ``kernel`` as the saved default, ``settings``."""
    image.kernels.require(kernel)
    env = node_env(settings)
    path.unlink(missing_ok=True)
    _mtools(["mkfs.vfat", "-C", "-n", LABEL, str(path), str(_SIZE_KIB)])
    image_arg = ["-i", str(path)]
    _mtools(["mmd", *image_arg, "::/EFI", "::/EFI/BOOT", _GRUB_DIR, "::/kmm"])
    _mtools(["mcopy", *image_arg, str(image.shim), "::/EFI/BOOT/BOOTX64.EFI"])
    _mtools(["mcopy", *image_arg, str(image.grub), "::/EFI/BOOT/grubx64.efi"])
    with tempfile.TemporaryDirectory(prefix="kmm-esp-") as work:
        staged = Path(work)
        (staged / "grub.cfg").write_text(
            grub.config(
                image.kernels.versions,
                root_uuid=image.root_uuid,
                extra_arguments=kernel_arguments,
            )
        )
        (staged / "grubenv").write_bytes(grub.environment({"saved_entry": grub.entry_id(kernel)}))
        _mtools(["mcopy", *image_arg, str(staged / "grub.cfg"), str(staged / "grubenv"), _GRUB_DIR])
        node = staged / "kmm"
        node.mkdir()
        (node / "node.env").write_text(env)
        for name, content in settings.files.items():
            (node / name).write_bytes(content)
        _mtools(["mcopy", "-s", *image_arg, *(str(p) for p in sorted(node.iterdir())), "::/kmm"])


def set_kernel(path: Path, image: images.NodeImage, kernel: str) -> None:
    """Make ``kernel`` grub's saved default on the ESP at ``path``: what the
    node boots next."""
    image.kernels.require(kernel)
    with tempfile.TemporaryDirectory(prefix="kmm-esp-") as work:
        staged = Path(work) / "grubenv"
        staged.write_bytes(grub.environment({"saved_entry": grub.entry_id(kernel)}))
        _mtools(["mcopy", "-o", "-i", str(path), str(staged), f"{_GRUB_DIR}/grubenv"])


def saved_kernel(path: Path) -> str:
    """The saved default of the ESP at ``path`` ("" when none)."""
    with tempfile.TemporaryDirectory(prefix="kmm-esp-") as work:
        copied = Path(work) / "grubenv"
        _mtools(["mcopy", "-i", str(path), f"{_GRUB_DIR}/grubenv", str(copied)])
        entry = grub.read_environment(copied.read_bytes()).get("saved_entry", "")
        return grub.entry_kernel(entry)
