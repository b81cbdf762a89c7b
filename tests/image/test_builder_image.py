"""The builder image and the kbuild test image, as `make image` and `make
test-images` wrote them.

The builder image (build/kmm-builder-image.tar) is unpacked as a runtime
would and checked for what build and sign pods (kmm.operator.build.pods)
run: its reference is the operator's default, buildah finds its network
helper, registries are never guessed, storage is overlay, and its
``sign-file`` (run here under chroot, with the image's own libraries) signs
a file. kbuild (build/images/kbuild.tar) carries the headers of exactly the
kernel build/images/kbuild.kernel names. Needs root, as the image test does.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tomllib
from pathlib import Path

import imagearchives

from kmm.operator.build import podparts, settings

BUILDER = imagearchives.BUILD / "kmm-builder-image.tar"
IMAGES = imagearchives.BUILD / "images"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
_TRAILER = b"~Module signature appended~\n"


def test_the_builder_image_has_what_build_and_sign_pods_run(tmp_path: Path) -> None:
    archive = imagearchives.required(BUILDER, target="image")
    image = imagearchives.open_image(archive, tmp_path / "layout")
    assert image.reference == settings.DEFAULT_BUILDER_IMAGE
    assert "BUILDAH_ISOLATION=chroot" in image.config["config"]["Env"]
    rootfs = imagearchives.unpack(image, tmp_path / "rootfs")
    registries = tomllib.loads((rootfs / "etc/containers/registries.conf").read_text())
    assert registries["unqualified-search-registries"] == []
    storage = tomllib.loads((rootfs / "etc/containers/storage.conf").read_text())
    assert storage["storage"]["driver"] == "overlay"
    assert storage["storage"]["graphroot"].startswith(podparts.STORAGE + "/")
    # buildah 1.39 refuses to start without netavark.
    assert (rootfs / "usr/lib/podman/netavark").is_file()
    for program in ("usr/bin/buildah", "usr/bin/openssl", "usr/sbin/modinfo", "usr/bin/sh"):
        assert (rootfs / program).exists(), program
    # The scripts run sign-file from PATH: a link to the versioned kbuild's.
    link = rootfs / "usr/local/bin/sign-file"
    assert link.is_symlink()
    target = link.readlink()
    assert str(target).startswith("/usr/lib/linux-kbuild-6.")
    assert (rootfs / str(target).lstrip("/")).is_file()

    work = rootfs / "tmp"
    subprocess.run(
        [
            "openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=builder image test", "-keyout", str(work / "key.pem"),
            "-out", str(work / "cert.pem"),
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    content = b"\x7fELF not really a module\n" * 10
    (work / "file.ko").write_bytes(content)
    subprocess.run(
        [
            CHROOT,
            str(rootfs),
            "sign-file",
            "sha256",
            "/tmp/key.pem",
            "/tmp/cert.pem",
            "/tmp/file.ko",
        ],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
    )
    signed = (work / "file.ko").read_bytes()
    assert signed.startswith(content)
    assert signed.endswith(_TRAILER)
    (length,) = struct.unpack(">I", signed[-len(_TRAILER) - 4 : -len(_TRAILER)])
    assert len(content) + length + 12 + len(_TRAILER) == len(signed)


def test_kbuild_has_the_headers_of_the_kernel_kbuild_kernel_names(tmp_path: Path) -> None:
    kernel = imagearchives.required(IMAGES / "kbuild.kernel", target="test-images").read_text()
    archive = imagearchives.required(IMAGES / "kbuild.tar", target="test-images")
    image = imagearchives.open_image(archive, tmp_path / "layout")
    assert image.reference == "kmm.sandbox/kbuild:1"
    listed = subprocess.run(
        ["tar", "--list", "--file", str(image.layers[0])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    listed = [line.removeprefix("./") for line in listed]
    headers = {
        line.split("/")[2]
        for line in listed
        if line.startswith("usr/src/linux-headers-") and line.count("/") >= 3
    }
    assert headers == {f"linux-headers-{kernel.strip()}", f"linux-headers-{_common(kernel)}"}
    for program in ("usr/bin/gcc", "usr/bin/make", "usr/include/stdio.h"):
        assert program in listed, program
    assert f"usr/src/linux-headers-{kernel.strip()}/Makefile" in listed


def _common(kernel: str) -> str:
    # Debian's arch-independent half: linux-headers-<abi>-common.
    return kernel.strip().removesuffix("-amd64") + "-common"
