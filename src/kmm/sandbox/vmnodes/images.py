"""The VM node image: one root filesystem every VM node boots, cached by content.

Made by ``build`` (a build step: it downloads Debian's packages), found by
``find`` (what a sandbox and the tests do: no download). The image is a
directory ``<cache>/vm/node-<key>/``:

- ``root.img``: a raw ext4 filesystem (no partition table; grub and the
  kernel find it by UUID), made by ``mkfs.ext4 -d`` from an mmdebstrap tree
  of Debian bookworm with systemd, dbus, udev, kmod, iproute2, iptables, conntrack,
  ping, qemu's guest agent and the kernels of the list (``kernels``), each with an
  initrd holding just what mounts a virtio disk (``guest/initramfs-hook``);
  plus the sandbox's pinned kubelet, kube-proxy, containerd, runc and CNI
  plugins, copied from the binary cache (baked in rather than shared over
  9p: one copy per image, nothing of the host's mounted into a guest), and
  their systemd units (``guest/kmm-*.service``), which start only on a node
  whose ESP carries a Kubernetes node's files (``kubernetes``).
  Never written once made: each node boots a copy-on-write overlay of it;
- ``shimx64.efi``, ``grubx64.efi``: Debian's signed shim and grub, from the
  same archive as the guest (packages ``shim-signed`` and
  ``grub-efi-amd64-signed``, downloaded, never installed, on any machine):
  what each node's ESP boots (``esp``);
- ``image.json``: the kernels, the root filesystem's UUID, where the boot
  files came from.

The key digests everything an image is made of: the recipe (mmdebstrap's
arguments, the guest files), the kernel list, the binaries' cache keys. A
build goes to a temporary directory renamed into place, so a crash leaves no
half image. Older images are left where they are: a running sandbox's
overlays may name them (delete ``<cache>/vm/node-*`` by hand to reclaim).

Needs root (mmdebstrap's root mode, ``mkfs.ext4 -d`` keeping owners).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Final

from kmm.sandbox import components, errors
from kmm.sandbox.vmnodes import kernels

__all__ = [
    "BINARIES",
    "NodeImage",
    "build",
    "find",
    "guest_dir",
    "image_key",
    "mmdebstrap_argv",
]

# Bumped when the way an image is made changes beyond what the key digests.
_RECIPE: Final = "1"
# Room for what nodes write (containerd's images, logs): the file is sparse.
_ROOT_SIZE: Final = "8G"
_PACKAGES: Final = (
    "systemd",
    "systemd-sysv",
    # logind (in systemd) needs it: the guest agent's reboot is `shutdown -r
    # +0`, which systemd schedules through logind; without a bus it fails.
    "dbus",
    "udev",
    "kmod",
    "iproute2",
    "iptables",
    "conntrack",
    # What a test (or a user) checks the node's network with from inside.
    "iputils-ping",
    "qemu-guest-agent",
    "initramfs-tools",
    "zstd",
)
# The pinned binaries a node runs, by where they go in the guest.
BINARIES: Final = (
    (components.KUBELET, "/usr/local/bin", ("kubelet",)),
    (components.KUBE_PROXY, "/usr/local/bin", ("kube-proxy",)),
    (components.CONTAINERD, "/usr/local/bin", ("containerd", "containerd-shim-runc-v2", "ctr")),
    (components.RUNC, "/usr/local/bin", ("runc",)),
    (components.CNI_PLUGINS, "/opt/cni/bin", ("bridge", "host-local", "loopback", "portmap")),
)
# Units that would wake a node for work it has no use for (apt's timers
# would dial an archive it has no route to).
_MASKED: Final = (
    # Virtual consoles nobody sees (no display); the serial console keeps its getty.
    "getty@.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
)
# Unit -> the target whose .wants/ enables it (the units' [Install] sections).
_ENABLED: Final = (
    ("kmm-node-setup.service", "sysinit.target"),
    ("systemd-networkd.service", "multi-user.target"),
    ("systemd-networkd.socket", "sockets.target"),
    # Started only on a node the sandbox made a Kubernetes node (each unit's
    # condition: ``kubernetes``' files on its ESP).
    ("kmm-containerd.service", "multi-user.target"),
    ("kmm-kubelet.service", "multi-user.target"),
    ("kmm-kube-proxy.service", "multi-user.target"),
)
# The node's own units, and the scripts they run (in /usr/local/lib/kmm).
_UNITS: Final = (
    "kmm-node-setup.service",
    "kmm-containerd.service",
    "kmm-kubelet.service",
    "kmm-kube-proxy.service",
)
_SCRIPTS: Final = ("node-setup", "node-prepare")
_BOOT_FILES: Final = {
    # package -> (path of the signed binary in it, name in the image directory)
    "shim-signed": ("usr/lib/shim/shimx64.efi.signed", "shimx64.efi"),
    "grub-efi-amd64-signed": ("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed", "grubx64.efi"),
}
_GUEST_FILES: Final = ("initramfs-hook", *_SCRIPTS, *_UNITS)


@dataclasses.dataclass(frozen=True)
class NodeImage:
    """A built image (see the module docstring)."""

    directory: Path
    kernels: kernels.KernelList
    root_uuid: str

    @property
    def root(self) -> Path:
        return self.directory / "root.img"

    @property
    def shim(self) -> Path:
        return self.directory / "shimx64.efi"

    @property
    def grub(self) -> Path:
        return self.directory / "grubx64.efi"


def guest_dir() -> Path:
    """The files the image puts in the guest (``guest/``)."""
    return Path(str(resources.files("kmm.sandbox.vmnodes").joinpath("guest")))


def mmdebstrap_argv(chosen: kernels.KernelList, tree: Path, guest: Path) -> list[str]:
    """mmdebstrap making the image's tree in ``tree`` (a directory), with the
    guest files from ``guest``: the initrd settings before any kernel is
    installed (an essential hook), the signed boot files fetched at the end
    into ``/usr/lib/kmm-node/efi`` (a customize hook; ``build`` moves them out)."""
    packages = [*_PACKAGES, *(f"linux-image-{kernel}" for kernel in chosen.versions)]
    initramfs = " && ".join(
        [
            'mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/etc/initramfs-tools/hooks"',
            'echo MODULES=list >"$1/etc/initramfs-tools/conf.d/kmm-node.conf"',
            f"cp {shlex.quote(str(guest / 'initramfs-hook'))} "
            '"$1/etc/initramfs-tools/hooks/kmm-node"',
        ]
    )
    fetch = " && ".join(
        [
            'mkdir -p "$1/tmp/kmm-efi" "$1/usr/lib/kmm-node/efi"',
            'chroot "$1" sh -c "cd /tmp/kmm-efi && apt-get download ' + " ".join(_BOOT_FILES) + '"',
            'for deb in "$1"/tmp/kmm-efi/*.deb; do dpkg-deb --extract "$deb" "$1/tmp/kmm-efi/x"; '
            'basename "$deb" >>"$1/usr/lib/kmm-node/efi/packages"; done',
            *(
                f'cp "$1/tmp/kmm-efi/x/{source}" "$1/usr/lib/kmm-node/efi/{name}"'
                for source, name in _BOOT_FILES.values()
            ),
            'rm -rf "$1/tmp/kmm-efi"',
        ]
    )
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--include=" + ",".join(packages),
        "--aptopt=Acquire::Languages none",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        f"--essential-hook={initramfs}",
        f"--customize-hook={fetch}",
        chosen.suite,
        str(tree),
        *kernels.sources(chosen.suite),
    ]


def image_key(chosen: kernels.KernelList, guest: Path | None = None) -> str:
    """The digest naming an image made from ``chosen`` with today's recipe,
    guest files and pinned binaries."""
    guest = guest or guest_dir()
    digest = hashlib.sha256(_RECIPE.encode())
    digest.update(chosen.key.encode())
    digest.update("\0".join(mmdebstrap_argv(chosen, Path("/tree"), Path("/guest"))).encode())
    for name in _GUEST_FILES:
        digest.update(name.encode() + b"\0" + (guest / name).read_bytes())
    for tool, target, names in BINARIES:
        digest.update(f"{tool.cache_key} {target} {' '.join(names)}".encode())
    digest.update(f"{_ROOT_SIZE} {' '.join(_MASKED)} {_ENABLED}".encode())
    return digest.hexdigest()[:16]


def _directory(cache_dir: Path, key: str) -> Path:
    return cache_dir / "vm" / f"node-{key}"


def find(cache_dir: Path, chosen: kernels.KernelList) -> NodeImage | None:
    """The image of ``chosen`` with today's recipe, or None when not built."""
    directory = _directory(cache_dir, image_key(chosen))
    try:
        document = json.loads((directory / "image.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise errors.SandboxError(f"{directory} holds no readable image.json: {err}") from err
    return NodeImage(directory=directory, kernels=chosen, root_uuid=str(document["rootUuid"]))


def _run(argv: list[str], log: Path) -> None:
    with log.open("ab") as stream:
        stream.write(f"$ {shlex.join(argv)}\n".encode())
        stream.flush()
        code = subprocess.run(argv, stdout=stream, stderr=subprocess.STDOUT, check=False)
    if code.returncode != 0:
        raise errors.SandboxError(
            f"`{argv[0]}` failed building the VM node image ({code.returncode}); see {log}"
        )


def _customize(tree: Path, guest: Path, binaries: Mapping[str, Path], root_uuid: str) -> None:
    """What the tree gets beyond Debian's packages (see the module docstring)."""
    for tool, target, names in BINARIES:
        directory = tree / target.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name not in binaries:
                raise errors.SandboxError(f"{tool.name}'s {name} is not built")
            shutil.copyfile(binaries[name], directory / name)
            (directory / name).chmod(0o755)
    lib = tree / "usr/local/lib/kmm"
    lib.mkdir(parents=True, exist_ok=True)
    for script in _SCRIPTS:
        shutil.copyfile(guest / script, lib / script)
        (lib / script).chmod(0o755)
    systemd = tree / "etc/systemd/system"
    for unit in _UNITS:
        shutil.copyfile(guest / unit, systemd / unit)
    for unit, target in _ENABLED:
        wants = systemd / f"{target}.wants"
        wants.mkdir(exist_ok=True)
        # Links as the guest sees them: its own /etc or its packages' units.
        own = (systemd / unit).exists()
        source = Path("/etc/systemd/system" if own else "/lib/systemd/system") / unit
        (wants / unit).unlink(missing_ok=True)
        (wants / unit).symlink_to(source)
    for unit in _MASKED:
        (systemd / unit).unlink(missing_ok=True)
        (systemd / unit).symlink_to("/dev/null")
    (tree / "etc/fstab").write_text(f"UUID={root_uuid} / ext4 rw,errors=remount-ro 0 0\n")
    # Empty: each node's first boot writes one of its own into its overlay.
    (tree / "etc/machine-id").write_text("")
    (tree / "etc/hostname").write_text("kmm-vm-node\n")


def build(
    cache_dir: Path,
    chosen: kernels.KernelList,
    binaries: Mapping[str, Path],
    *,
    log: Path,
) -> NodeImage:
    """The image of ``chosen``, built now unless cached (see the module
    docstring). ``binaries``: every name of ``BINARIES``, built
    (``building.ensure_built``). Progress and tools' output go to ``log``."""
    found = find(cache_dir, chosen)
    if found is not None:
        return found
    key = image_key(chosen)
    target = _directory(cache_dir, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    root_uuid = str(uuid.UUID(hashlib.sha256(key.encode()).hexdigest()[:32]))
    guest = guest_dir()
    staging = Path(tempfile.mkdtemp(prefix=f".node-{key}-", dir=target.parent))
    try:
        tree = staging / "tree"
        _run(mmdebstrap_argv(chosen, tree, guest), log)
        efi = tree / "usr/lib/kmm-node/efi"
        for _, name in _BOOT_FILES.values():
            shutil.move(efi / name, staging / name)
        packages = (efi / "packages").read_text().split()
        shutil.rmtree(efi.parent)
        _customize(tree, guest, binaries, root_uuid)
        _run(
            [
                "mkfs.ext4", "-q", "-F", "-L", "kmmroot", "-U", root_uuid,
                "-E", "lazy_itable_init=1,lazy_journal_init=1",
                "-d", str(tree), str(staging / "root.img"), _ROOT_SIZE,
            ],
            log,
        )  # fmt: skip
        shutil.rmtree(tree)
        (staging / "root.img").chmod(0o444)
        document = {
            "key": key,
            "kernels": list(chosen.versions),
            "suite": chosen.suite,
            "rootUuid": root_uuid,
            "bootPackages": packages,
        }
        (staging / "image.json").write_text(json.dumps(document, indent=2) + "\n")
        os.rename(staging, target)
    except OSError as err:
        if not (target / "image.json").is_file():
            raise errors.SandboxError(f"could not build the VM node image: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    image = find(cache_dir, chosen)
    assert image is not None
    return image
