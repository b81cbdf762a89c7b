"""A loaded kernel module's devices on a container node (``--fake-module NAME=COUNT``).

The kernel here cannot load modules, so a container node shows one as a
user's node shows a loaded module, at the paths a driver reads there:
``/sys/class/NAME/NAMEi/dev`` (``MAJOR:i``), ``/sys/module/NAME/version``
and a real character device ``/dev/NAMEi`` (``mknod``, the same numbers,
mode 0600 as udev leaves a device no rule names).
A driver pod that mounts the node's ``/sys`` and ``/dev`` (hostPath, as a
user's DRA Module does) finds them, and a CDI spec naming ``/dev/NAMEi``
is applied by runc as on any node. Nothing opens the device: no driver owns
its major (240 and up are the kernel's "local/experimental" numbers, one per
fake module), so only its name and numbers are real.

Only the node's mount namespace sees them: its ``/sys/class``,
``/sys/module`` and ``/dev`` are overlays whose lower layer is the host's
and whose upper layer (with the fake entries, and anything the node's
software writes there) lies in the node's directory; ``/dev``'s own mounts
(``pts``, ``shm``, ``mqueue`` ...) are bound again on top. The host's
``/sys`` and ``/dev`` are never written.

Limits: the sysfs entries are plain directories and files (a real node's
``/sys/class`` entries are symlinks into ``/sys/devices``), nothing appears
in ``/proc/modules``, and a module cannot come or go while the node runs.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = ["DEVICE_MODE", "FIRST_MAJOR", "FakeModule", "lay_out", "mount_lines", "parse"]

FakeModule = tuple[str, int]  # (module name, device count)

FIRST_MAJOR: Final = 240
# udev's mode for a device no rule names: root's alone.
DEVICE_MODE: Final = 0o600
_NAME: Final = re.compile(r"^[a-z0-9_]{1,55}$")
_MAX_DEVICES: Final = 64
# Overlaid mount point -> the upper directory's name under <node>/fake.
_OVERLAID: Final = {"/sys/class": "sys-class", "/sys/module": "sys-module", "/dev": "dev"}


def parse(text: str) -> FakeModule:
    """``NAME=COUNT`` -> (NAME, COUNT); ValueError naming the option and the rule."""
    name, sep, count = text.partition("=")
    if not sep or not _NAME.match(name):
        raise ValueError(
            f"--fake-module {text!r}: NAME=COUNT with NAME of lowercase letters, digits and _"
        )
    if not count.isdigit() or not 1 <= int(count) <= _MAX_DEVICES:
        raise ValueError(f"--fake-module {text!r}: COUNT must be 1 to {_MAX_DEVICES}")
    return name, int(count)


def check(modules: Sequence[FakeModule]) -> None:
    """ValueError if a module is named twice or there are more than the free majors."""
    names = [name for name, _ in modules]
    if len(set(names)) != len(names):
        raise ValueError("--fake-module: a module is named twice")
    if FIRST_MAJOR + len(modules) - 1 > 254:
        raise ValueError("--fake-module: at most 15 modules")


def _upper(node_dir: Path, target: str) -> Path:
    return node_dir / "fake" / _OVERLAID[target]


def lay_out(node_dir: Path, modules: Sequence[FakeModule]) -> None:
    """Write the upper layers' entries under ``node_dir/fake`` (mknod for the
    device nodes: as root, like the rest of a container node)."""
    for target in _OVERLAID:
        _upper(node_dir, target).mkdir(parents=True, exist_ok=True)
    for number, (name, count) in enumerate(modules):
        major = FIRST_MAJOR + number
        module_dir = _upper(node_dir, "/sys/module") / name
        module_dir.mkdir(exist_ok=True)
        (module_dir / "version").write_text("1.0\n")
        for minor in range(count):
            entry = _upper(node_dir, "/sys/class") / name / f"{name}{minor}"
            entry.mkdir(parents=True, exist_ok=True)
            (entry / "dev").write_text(f"{major}:{minor}\n")
            device = _upper(node_dir, "/dev") / f"{name}{minor}"
            if not device.is_char_device():
                device.unlink(missing_ok=True)
                os.mknod(device, stat.S_IFCHR | DEVICE_MODE, os.makedev(major, minor))
            device.chmod(DEVICE_MODE)  # mknod's mode passes through the umask


def mount_lines(node_dir: Path) -> list[str]:
    """Shell lines (run in the node's mount namespace, private from the
    host's) overlaying ``/sys/class``, ``/sys/module`` and ``/dev`` with the
    laid-out entries, ``/dev``'s submounts bound again on top."""
    work = node_dir / "fake" / "work"
    stash = node_dir / "fake" / "dev-below"
    lines = [f"mkdir -p {shlex.quote(str(stash))}"]
    # /dev's own mounts, outermost first (each rbind brings those below it).
    lines.append(
        "dev_mounts=$(awk '$5 ~ \"^/dev/\" {print $5}' /proc/self/mountinfo | sort -u"
        ' | awk \'prev == "" || index($0, prev "/") != 1 {print; prev = $0}\')'
    )
    lines.append(f"mount --rbind /dev {shlex.quote(str(stash))}")
    for target, name in _OVERLAID.items():
        upper = shlex.quote(str(_upper(node_dir, target)))
        workdir = shlex.quote(str(work / name))
        lines.append(f"mkdir -p {workdir}")
        lines.append(
            "mount -t overlay kmm-sandbox -o "
            + f"lowerdir={shlex.quote(target)},upperdir={upper},workdir={workdir} "
            + shlex.quote(target)
        )
    lines.append(
        "for m in $dev_mounts; do mount --rbind "
        + shlex.quote(str(stash))
        + '"${m#/dev}" "$m"; done'
    )
    lines.append(f"umount -l {shlex.quote(str(stash))}")
    return lines
