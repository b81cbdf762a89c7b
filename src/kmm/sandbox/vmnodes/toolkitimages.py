"""Driver toolkit images: each VM node kernel's toolkit as an OCI image,
``10.253.0.1:5000/kmm/driver-toolkit:<tag-safe kernel>`` in a sandbox's registry.

What OpenShift's driver-toolkit image is to its kernels, and what the
operator's ``--driver-toolkit-image`` names (``TEMPLATE``) so that a KMM
Dockerfile written ``ARG DTK_AUTO`` / ``FROM ${DTK_AUTO}`` builds offline
in the sandbox: Debian bookworm with gcc, make, kmod, that kernel's headers
and kbuild tools (``toolkits``, whose tarball is the image's first layer as
it is), and ``/etc/driver-toolkit-release.json`` naming the kernel, as
OpenShift's image has (a second layer of one file).

``build`` (``make vm-toolkit-images``, after the toolkits) writes the image
as an OCI layout under ``<cache>/vm/toolkit-image-<tag>-<key>/``; the key
covers the toolkit's own (so the kernel list's) and this recipe, so a new
list or recipe makes new images. ``seeds`` gives a starting sandbox what
its registry is seeded with (``registryseeding``: linked, not uploaded);
a kernel whose image is not built is left out, and ``up`` says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Final

from kmm.oci import layouts
from kmm.sandbox import registry, registryseeding
from kmm.sandbox.vmnodes import kernels, toolkits

__all__ = [
    "NAME",
    "RELEASE_FILE",
    "TEMPLATE",
    "build",
    "find",
    "image_key",
    "reference",
    "release_layer",
    "seeds",
    "served",
]

NAME: Final = "kmm/driver-toolkit"
# What the operator's --driver-toolkit-image is for the sandbox's images.
TEMPLATE: Final = f"{registry.REFERENCE_HOST}/{NAME}:${{KERNEL_FULL_VERSION}}"
RELEASE_FILE: Final = "etc/driver-toolkit-release.json"
_RECIPE: Final = "1"
# One fixed time for the config and the release file: the same toolkit
# makes the same image.
_CREATED: Final = "2025-01-01T00:00:00Z"
_EPOCH: Final = 1735689600
_PATH: Final = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def reference(chosen: kernels.KernelList, kernel: str) -> str:
    """How pods name ``kernel``'s image (TEMPLATE expanded for it)."""
    return f"{registry.REFERENCE_HOST}/{NAME}:{chosen.tag(kernel)}"


def release_layer(kernel: str) -> bytes:
    """The tar of ``/etc/driver-toolkit-release.json`` for ``kernel``
    (OpenShift's file: ``KERNEL_VERSION``; no RHEL or RT version here)."""
    body = json.dumps({"KERNEL_VERSION": kernel}, indent=2).encode() + b"\n"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        # Its directory first, as the base layer has it: an unpacker never
        # has to make a parent up.
        parent = tarfile.TarInfo("etc")
        parent.type, parent.mode, parent.mtime = tarfile.DIRTYPE, 0o755, _EPOCH
        archive.addfile(parent)
        entry = tarfile.TarInfo(RELEASE_FILE)
        entry.size, entry.mode, entry.mtime = len(body), 0o644, _EPOCH
        archive.addfile(entry, io.BytesIO(body))
    return out.getvalue()


def _config(kernel: str, layers: list[layouts.Layer]) -> dict[str, Any]:
    return layouts.image_config(
        layers,
        created=_CREATED,
        env=(_PATH,),
        cmd=("/bin/bash",),
        labels={
            "org.opencontainers.image.title": f"kmm driver toolkit {kernel}",
            "kmm.driver-toolkit.kernel": kernel,
        },
        history="kmm.sandbox.vmnodes.toolkitimages",
    )


def image_key(chosen: kernels.KernelList, kernel: str) -> str:
    """What names ``kernel``'s image: its toolkit's key and this recipe."""
    digest = hashlib.sha256(_RECIPE.encode())
    digest.update(toolkits.toolkit_key(chosen, kernel).encode())
    digest.update(release_layer(kernel))
    digest.update(json.dumps(_config(kernel, []), sort_keys=True).encode())
    return digest.hexdigest()[:12]


def _directory(cache_dir: Path, chosen: kernels.KernelList, kernel: str) -> Path:
    name = f"toolkit-image-{chosen.tag(kernel)}-{image_key(chosen, kernel)}"
    return cache_dir / "vm" / name


def find(cache_dir: Path, chosen: kernels.KernelList, kernel: str) -> Path | None:
    """``kernel``'s image layout, or None when not built."""
    found = _directory(cache_dir, chosen, kernel)
    return found if (found / "index.json").is_file() else None


def build(cache_dir: Path, chosen: kernels.KernelList, kernel: str, toolkit: Path) -> Path:
    """``kernel``'s image layout from its ``toolkit`` tarball, made now unless
    cached (one read and gzip of the tarball: 13 to 15 s for 370 MiB here,
    about 120 MiB compressed)."""
    target = _directory(cache_dir, chosen, kernel)
    if (target / "index.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with toolkit.open("rb") as rootfs:
            base = layouts.add_gzip_layer(work, rootfs)
        release = layouts.add_gzip_layer(work, io.BytesIO(release_layer(kernel)))
        layers = [base, release]
        layouts.write_image(
            work, _config(kernel, layers), layers, ref_name=f"{NAME}:{chosen.tag(kernel)}"
        )
        work.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def seeds(
    cache_dir: Path, chosen: kernels.KernelList
) -> tuple[list[registryseeding.Seed], list[str]]:
    """The images a sandbox's registry is seeded with, and the kernels of
    ``chosen`` whose image is not built."""
    found, missing = [], []
    for kernel in chosen.versions:
        layout = find(cache_dir, chosen, kernel)
        if layout is None:
            missing.append(kernel)
        else:
            found.append(registryseeding.Seed(layout, NAME, chosen.tag(kernel)))
    return found, missing


def served(directory: Path, chosen: kernels.KernelList) -> tuple[list[str], list[str]]:
    """What the registry of the sandbox in ``directory`` holds of the
    images of ``chosen``: the references it serves, and the kernels it has
    none for."""
    held = set(registryseeding.tags(registry.storage(directory), NAME))
    references = [reference(chosen, k) for k in chosen.versions if chosen.tag(k) in held]
    return references, [k for k in chosen.versions if chosen.tag(k) not in held]
