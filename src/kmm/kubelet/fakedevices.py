"""A loaded kernel module's devices as files, for an emulated node.

``lay_out(root, module, count)`` writes what ``kmm driver --root`` discovers
for a module that is loaded and exposes ``count`` character devices:
``<root>/sys/module/<module>/version``, ``<root>/sys/class/<module>/<module>N/dev``
(``240:N``) and an empty ``<root>/dev/<module>N``. Nothing is a real device;
a driver that opens them finds regular files.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["lay_out"]


def lay_out(root: Path, module: str, count: int, version: str = "1.0") -> None:
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
    (root / "sys/module" / module / "version").write_text(f"{version}\n")
    for i in range(count):
        entry = root / "sys/class" / module / f"{module}{i}"
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (root / "dev" / f"{module}{i}").touch()
