"""A VM's files, laid out before its first start (``qemu.Machine`` names them).

- the root disk: a qcow2 overlay whose backing file is the image's
  ``root.img`` (never written: every node's writes land in its overlay);
- the firmware's variables: the node's own copy, the sandbox key enrolled
  (``firmware.variables``);
- the ESP: boot files, grub's config and saved default, the node's settings
  (``esp.make``).

Everything is the node's own, in its directory, and goes with it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import esp, firmware, images, qemu

__all__ = ["overlay", "prepare"]


def overlay(backing: Path, target: Path) -> None:
    """A qcow2 at ``target`` over the raw ``backing`` file."""
    result = subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(backing), str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise errors.SandboxError(
            f"qemu-img could not make the overlay {target}: {result.stderr.strip()}"
        )


def prepare(
    machine: qemu.Machine,
    image: images.NodeImage,
    settings: esp.NodeSettings,
    *,
    kernel: str,
    key: firmware.SigningKey | None,
    kernel_arguments: tuple[str, ...] = (),
) -> None:
    """Lay out ``machine``'s files for its first boot, on ``kernel``."""
    machine.directory.mkdir(parents=True, exist_ok=True)
    if not machine.root.exists():
        overlay(image.root, machine.root)
    firmware.variables(machine.variables, key, secure_boot=machine.secure_boot)
    esp.make(machine.esp, image, settings, kernel=kernel, kernel_arguments=kernel_arguments)
