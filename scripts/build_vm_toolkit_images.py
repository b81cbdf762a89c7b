"""`make vm-toolkit-images`: each VM node kernel's driver toolkit image.

The toolkit of each kernel of the recorded list (kmm.sandbox.vmnodes.toolkits,
built here when missing: downloads) made an OCI image layout under
~/.cache/kmm/vm/toolkit-image-<tag>-<key>/ (kmm.sandbox.vmnodes.toolkitimages),
cached by content; a sandbox with VM nodes seeds its registry with them as
10.253.0.1:5000/kmm/driver-toolkit:<tag-safe kernel>. Prints each image's
size and how long it took. Run as root by .venv/bin/python, after `make
vm-image` (which chooses the kernels).
"""

from __future__ import annotations

import sys
import time

from kmm.cli import paths
from kmm.oci import layouts
from kmm.sandbox import errors
from kmm.sandbox.vmnodes import kernels, toolkitimages, toolkits


def main() -> int:
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    if chosen is None:
        print("vm-toolkit-images: no kernel list yet; run `make vm-image` first", file=sys.stderr)
        return 1
    log = cache / "vm" / "build.log"
    for kernel in chosen.versions:
        started = time.monotonic()
        try:
            toolkit = toolkits.build(cache, chosen, kernel, log=log)
            layout = toolkitimages.build(cache, chosen, kernel, toolkit)
            image = layouts.read(layout)
        except (errors.SandboxError, OSError, ValueError) as err:
            print(f"vm-toolkit-images: {kernel}: {err}", file=sys.stderr)
            return 1
        size = sum(blob.size for blob in image.blobs)
        print(
            f"vm-toolkit-images: {toolkitimages.reference(chosen, kernel)} "
            f"({size / 2**20:.0f} MiB compressed, {layout}; {time.monotonic() - started:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
