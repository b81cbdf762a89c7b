"""`make vm-test-modules`: the VM node test's module, built for each node kernel.

tests/vm/kmm_vm_test compiled against each kernel's Debian headers in that
kernel's toolkit (kmm.sandbox.vmnodes.toolkits, built here when missing:
downloads), written with the toolkit's sign-file to
build/vm/modules/<kernel>/. Built again only when the source or a toolkit
changes (a stamp beside the outputs holds their digest). Run as root by
.venv/bin/python, after `make vm-image` (which chooses the kernels).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from kmm.cli import paths
from kmm.sandbox import errors
from kmm.sandbox.vmnodes import kernels, toolkits

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "vm" / "kmm_vm_test"
OUT = ROOT / "build" / "vm" / "modules"


def _digest(toolkit: Path) -> str:
    found = hashlib.sha256(toolkit.name.encode())
    for path in sorted(SOURCE.iterdir()):
        found.update(path.name.encode() + b"\0" + path.read_bytes())
    return found.hexdigest()


def main() -> int:
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    if chosen is None:
        print("vm-test-modules: no kernel list yet; run `make vm-image` first", file=sys.stderr)
        return 1
    log = cache / "vm" / "build.log"
    for kernel in chosen.versions:
        started = time.monotonic()
        try:
            toolkit = toolkits.build(cache, chosen, kernel, log=log)
            out = OUT / kernel
            stamp = out / ".stamp"
            digest = _digest(toolkit)
            if not (stamp.is_file() and stamp.read_text() == digest):
                made = toolkits.build_module(toolkit, kernel, SOURCE, out, log=log)
                if not made:
                    raise errors.SandboxError(f"{SOURCE} made no module for {kernel}")
                stamp.write_text(digest)
        except errors.SandboxError as err:
            print(f"vm-test-modules: {err}", file=sys.stderr)
            return 1
        print(f"vm-test-modules: {out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
