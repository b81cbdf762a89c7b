"""`make vm-image`: the VM node image, built unless cached (kmm.sandbox.vmnodes.images).

Chooses the node kernels first if no list is recorded yet (vmnodes.kernels:
asks the Debian archive), builds whatever pinned binary the image bakes in
and is missing, then the image itself (mmdebstrap, mkfs.ext4; a few minutes
cold, nothing when cached). Prints the kernels and the image's directory.
Run as root by .venv/bin/python; downloads Debian's packages: a build step,
never a test.
"""

from __future__ import annotations

import asyncio
import sys
import time

from kmm.cli import paths
from kmm.sandbox import building, errors
from kmm.sandbox.vmnodes import images, kernels


def main() -> int:
    cache = paths.cache_dir()
    started = time.monotonic()
    try:
        chosen = kernels.ensure(cache)
        print(f"vm-image: kernels {', '.join(chosen.versions)} ({kernels.list_path(cache)})")
        tools = tuple(dict.fromkeys(tool for tool, _, _ in images.BINARIES))
        binaries = asyncio.run(building.ensure_built(cache, tools))
        log = cache / "vm" / "build.log"
        if images.find(cache, chosen) is None:
            print(f"vm-image: building the node image (log: {log})")
        image = images.build(cache, chosen, binaries, log=log)
    except errors.SandboxError as err:
        print(f"vm-image: {err}", file=sys.stderr)
        return 1
    print(f"vm-image: {image.directory} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
