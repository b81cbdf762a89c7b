"""What grub reads on a VM node's ESP: its configuration and its environment.

Boot chain: OVMF -> shim (``EFI/BOOT/BOOTX64.EFI``) -> grub (``grubx64.efi``
beside it) -> Debian's signed kernel. Debian's signed grub is one image with
its modules built in (Secure Boot forbids loading more) whose prefix is
``/EFI/debian`` on the disk it was loaded from: it reads ``grub.cfg`` there,
written here by hand (no ``update-grub`` runs anywhere).

Under Secure Boot qemu may not pass a kernel command line (``-append``), so
every kernel argument is in ``grub.cfg``. The node's kernel is grub's saved
default: ``grubenv`` beside ``grub.cfg`` names it (``saved_entry``, a menu
entry's id: ``linux-`` and the kernel version); the host rewrites that file
to boot another kernel next (``esp.set_kernel``), never grub nor the guest.

grub's environment block is exactly 1024 bytes: a header line,
``name=value`` lines, ``#`` padding (what ``grub-editenv`` writes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = [
    "ENV_SIZE",
    "config",
    "entry_id",
    "entry_kernel",
    "environment",
    "kernel_arguments",
    "read_environment",
]

ENV_SIZE: Final = 1024
_ENV_HEADER: Final = "# GRUB Environment Block\n"
# What a value in grubenv or grub.cfg may hold here: kernel versions, UUIDs,
# arguments without quotes, backslashes or newlines.
_PLAIN: Final = re.compile(r"[A-Za-z0-9._+:=,/@-]+")
# The serial port is the console: the log qemu writes to a file.
_CONSOLE: Final = "console=ttyS0,115200"
# Menu entry ids start with a letter: grub 2.06 reads a ``default`` that
# starts with a digit as an entry number ("6.12.118+deb12-amd64" is entry 6,
# which does not exist, so it boots the first), never as an id.
_ENTRY_PREFIX: Final = "linux-"


def _plain(what: str, value: str) -> str:
    if not _PLAIN.fullmatch(value):
        raise ValueError(f"{what} {value!r} holds a character grub's files may not carry")
    return value


def entry_id(kernel: str) -> str:
    """The id of ``kernel``'s menu entry: what ``saved_entry`` names."""
    return _ENTRY_PREFIX + _plain("kernel", kernel)


def entry_kernel(entry: str) -> str:
    """The kernel of menu entry id ``entry`` ("" for another id)."""
    return entry.removeprefix(_ENTRY_PREFIX) if entry.startswith(_ENTRY_PREFIX) else ""


def kernel_arguments(root_uuid: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The kernel's command line: the root filesystem by UUID (the disks'
    order is the firmware's business), read-write at once (no fsck pass on a
    disk only this node writes), the serial console, then ``extra``."""
    return (f"root=UUID={_plain('root UUID', root_uuid)}", "rw", _CONSOLE, *extra)


def config(kernels: Iterable[str], *, root_uuid: str, extra_arguments: Iterable[str] = ()) -> str:
    """``grub.cfg``: no menu wait, grub on the serial console, the saved
    default from ``grubenv`` when it names one, one entry per kernel (its id
    the version) booting ``/boot/vmlinuz-<v>`` and ``/boot/initrd.img-<v>``
    from the root filesystem. Without a saved default grub boots the first."""
    arguments = " ".join(
        _plain("kernel argument", argument)
        for argument in kernel_arguments(root_uuid, extra_arguments)
    )
    lines = [
        "set timeout=0",
        "serial --unit=0 --speed=115200",
        "terminal_input serial",
        "terminal_output serial",
        "load_env --file $prefix/grubenv",
        'if [ -n "${saved_entry}" ]; then set default="${saved_entry}"; fi',
        f"search --no-floppy --fs-uuid --set=root {_plain('root UUID', root_uuid)}",
    ]
    listed = list(kernels)
    if not listed:
        raise ValueError("grub.cfg needs at least one kernel")
    for kernel in listed:
        version = _plain("kernel", kernel)
        lines += [
            f"menuentry 'Debian GNU/Linux, Linux {version}' --id '{entry_id(version)}' {{",
            f"    linux /boot/vmlinuz-{version} {arguments}",
            f"    initrd /boot/initrd.img-{version}",
            "}",
        ]
    return "\n".join(lines) + "\n"


def environment(values: Mapping[str, str]) -> bytes:
    """A grub environment block holding ``values``."""
    body = _ENV_HEADER + "".join(
        f"{_plain('grubenv name', name)}={_plain('grubenv value', value)}\n"
        for name, value in values.items()
    )
    encoded = body.encode()
    if len(encoded) > ENV_SIZE:
        raise ValueError(f"grubenv would need {len(encoded)} bytes, more than {ENV_SIZE}")
    return encoded + b"#" * (ENV_SIZE - len(encoded))


def read_environment(block: bytes) -> dict[str, str]:
    """The values of a grub environment block (``environment``'s inverse)."""
    text = block.decode()
    if len(block) != ENV_SIZE or not text.startswith(_ENV_HEADER):
        raise ValueError("not a grub environment block")
    values = {}
    for line in text[len(_ENV_HEADER) :].split("\n"):
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
    return values
