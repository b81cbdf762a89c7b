from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    """A fake host tree; short, because unix socket paths are limited to 107 bytes."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_tree(root: pathlib.Path, *, count: int = 2, module: str = "foo") -> None:
    (root / "dev").mkdir(exist_ok=True)
    (root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
    (root / "sys/module" / module / "version").write_text("1.2.3\n")
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    for i in range(count):
        entry = root / "sys/class/foo" / f"foo{i}"
        (entry / "device").mkdir(parents=True, exist_ok=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (entry / "device/numa_node").write_text("-1\n" if i else "1\n")
        (root / "dev" / f"foo{i}").write_text("")
