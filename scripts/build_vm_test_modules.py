"""`make vm-test-modules`: the VM node test's module and the example's, built for each node kernel.

Each source compiled against each kernel's Debian headers in that kernel's
toolkit (kmm.sandbox.vmnodes.toolkits, built here when missing: downloads),
written with the toolkit's sign-file to ``<out>/<kernel>/``:

- tests/vm/kmm_vm_test -> build/vm/modules/ (tests/integration/test_vm_nodes.py);
- examples/kmmdemo/src -> build/vm/examples/kmmdemo/: the example's two
  modules as its Dockerfile builds them (version 1), so a change that breaks
  either kernel line fails here, before any cluster builds it.

Built again only when a source, its make arguments or a toolkit changes (a
stamp beside the outputs holds their digest). Run as root by .venv/bin/python,
after `make vm-image` (which chooses the kernels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from pathlib import Path

from kmm.cli import paths
from kmm.sandbox import errors
from kmm.sandbox.vmnodes import kernels, toolkits

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Modules:
    """One Kbuild directory, where its builds go, and what each must make."""

    source: Path
    out: Path
    made: tuple[str, ...]
    make_args: tuple[str, ...] = ()


BUILDS = (
    Modules(ROOT / "tests/vm/kmm_vm_test", ROOT / "build/vm/modules", ("kmm_vm_test.ko",)),
    Modules(
        ROOT / "examples/kmmdemo/src",
        ROOT / "build/vm/examples/kmmdemo",
        ("kmmdemo.ko", "kmmdemo_peer.ko"),
        # The Dockerfile's KMMDEMO_VERSION, at its default.
        ("KCFLAGS=-DKMMDEMO_VERSION=1",),
    ),
)


def _digest(toolkit: Path, modules: Modules) -> str:
    found = hashlib.sha256(toolkit.name.encode())
    found.update("\0".join(modules.make_args).encode() + b"\0")
    for path in sorted(modules.source.iterdir()):
        found.update(path.name.encode() + b"\0" + path.read_bytes())
    return found.hexdigest()


def _build(toolkit: Path, kernel: str, modules: Modules, *, log: Path) -> Path:
    """``modules`` built for ``kernel`` unless its stamp says they are."""
    out = modules.out / kernel
    stamp = out / ".stamp"
    digest = _digest(toolkit, modules)
    if stamp.is_file() and stamp.read_text() == digest:
        return out
    made = toolkits.build_module(
        toolkit, kernel, modules.source, out, log=log, make_args=modules.make_args
    )
    missing = sorted(set(modules.made) - {path.name for path in made})
    if missing:
        raise errors.SandboxError(f"{modules.source} made no {', '.join(missing)} for {kernel}")
    stamp.write_text(digest)
    return out


def main() -> int:
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    if chosen is None:
        print("vm-test-modules: no kernel list yet; run `make vm-image` first", file=sys.stderr)
        return 1
    log = cache / "vm" / "build.log"
    for kernel in chosen.versions:
        try:
            toolkit = toolkits.build(cache, chosen, kernel, log=log)
        except errors.SandboxError as err:
            print(f"vm-test-modules: {err}", file=sys.stderr)
            return 1
        for modules in BUILDS:
            started = time.monotonic()
            try:
                out = _build(toolkit, kernel, modules, log=log)
            except errors.SandboxError as err:
                print(f"vm-test-modules: {err}", file=sys.stderr)
                return 1
            print(f"vm-test-modules: {out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
