"""Toolkits: a root filesystem per VM node kernel that builds modules for it.

What OpenShift's driver-toolkit image is to its kernels: Debian bookworm
with make, kmod, gcc (the compiler the kernel was built with, also as
``gcc``), and that kernel's headers and kbuild tools (``sign-file`` among
them), made by mmdebstrap
(``toolkit/headers-hook`` picks the packages the headers name). Built by a
build step (downloads), cached as ``<cache>/vm/toolkit-<tag-safe
kernel>-<key>.tar`` under the kernel list's key: a new list builds new
toolkits. ``toolkitimages`` makes each an OCI image (the driver toolkit
images of a sandbox's registry). ``build_module`` compiles an out-of-tree module in one, chrooted in
a scratch copy (root needed).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Final

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import kernels

__all__ = ["build", "build_module", "find", "mmdebstrap_argv", "toolkit_key"]

_RECIPE: Final = "1"
# gcc: the headers bring gcc-12 (what bookworm's kernels are built with)
# but no `gcc`, which a Dockerfile written for a driver toolkit may call.
_PACKAGES: Final = ("make", "kmod", "libc6-dev", "gcc")


def _hook() -> Path:
    return Path(str(resources.files("kmm.sandbox.vmnodes").joinpath("toolkit/headers-hook")))


def mmdebstrap_argv(chosen: kernels.KernelList, kernel: str, out: Path, hook: Path) -> list[str]:
    """mmdebstrap making ``kernel``'s toolkit as the tarball ``out``."""
    chosen.require(kernel)
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--include=" + ",".join(_PACKAGES),
        "--aptopt=Acquire::Languages none",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        f'--customize-hook={shlex.quote(str(hook))} "$1" {shlex.quote(kernel)}',
        chosen.suite,
        str(out),
        *kernels.sources(chosen.suite),
    ]


def toolkit_key(chosen: kernels.KernelList, kernel: str) -> str:
    digest = hashlib.sha256(_RECIPE.encode())
    digest.update(chosen.key.encode())
    digest.update("\0".join(mmdebstrap_argv(chosen, kernel, Path("/out"), Path("/h"))).encode())
    digest.update(_hook().read_bytes())
    return digest.hexdigest()[:12]


def _path(cache_dir: Path, chosen: kernels.KernelList, kernel: str) -> Path:
    name = f"toolkit-{chosen.tag(kernel)}-{toolkit_key(chosen, kernel)}.tar"
    return cache_dir / "vm" / name


def find(cache_dir: Path, chosen: kernels.KernelList, kernel: str) -> Path | None:
    """``kernel``'s toolkit tarball, or None when not built."""
    path = _path(cache_dir, chosen, kernel)
    return path if path.is_file() else None


def build(cache_dir: Path, chosen: kernels.KernelList, kernel: str, *, log: Path) -> Path:
    """``kernel``'s toolkit tarball, built now unless cached."""
    target = _path(cache_dir, chosen, kernel)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial.tar")
    partial.unlink(missing_ok=True)
    with log.open("ab") as stream:
        argv = mmdebstrap_argv(chosen, kernel, partial, _hook())
        stream.write(f"$ {shlex.join(argv)}\n".encode())
        stream.flush()
        result = subprocess.run(argv, stdout=stream, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise errors.SandboxError(f"mmdebstrap could not make {kernel}'s toolkit; see {log}")
    partial.replace(target)
    return target


def build_module(
    toolkit: Path,
    kernel: str,
    source: Path,
    out: Path,
    *,
    log: Path,
    make_args: Sequence[str] = (),
) -> list[Path]:
    """Compile the out-of-tree module in ``source`` (a Kbuild directory) for
    ``kernel`` in a scratch copy of ``toolkit``, ``make_args`` (variables
    such as ``KCFLAGS=...``) on make's command line; the ``.ko`` files it
    made, copied to ``out``, beside the toolkit's ``sign-file``."""
    with tempfile.TemporaryDirectory(prefix="kmm-toolkit-") as work:
        root = Path(work)
        with tarfile.open(toolkit) as archive:
            archive.extractall(root, filter="fully_trusted")
        build_dir = root / "build"
        shutil.copytree(source, build_dir)
        headers = f"/usr/src/linux-headers-{kernel}"
        with log.open("ab") as stream:
            result = subprocess.run(
                ["chroot", str(root), "make", "-C", headers, "M=/build", *make_args, "modules"],
                stdout=stream,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            raise errors.SandboxError(f"building {source} for {kernel} failed; see {log}")
        out.mkdir(parents=True, exist_ok=True)
        made = []
        for module in sorted(build_dir.glob("*.ko")):
            shutil.copyfile(module, out / module.name)
            made.append(out / module.name)
        # Resolved inside the tree: its links may be absolute.
        inside = subprocess.run(
            ["chroot", str(root), "readlink", "-f", f"{headers}/scripts/sign-file"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        shutil.copyfile(root / inside.lstrip("/"), out / "sign-file")
        (out / "sign-file").chmod(0o755)
        return made
