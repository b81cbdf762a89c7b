"""kmm's image: built as `make image` builds it, and run without a container engine.

The archive is unpacked as a runtime would (OCI layout -> manifest -> layers
in order) into a root filesystem, and kmm runs there under chroot as the
user the image's config names. Built twice from the same commit, it has the
same layers. Needs root, as `make image` does (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_image.sh"
# Looked up here: the command runs with the image's environment, not ours.
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def _build(out: Path) -> Path:
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("image") / "kmm-image.tar")


def _blob(layout: Path, digest: str) -> Path:
    algorithm, value = digest.split(":")
    return layout / "blobs" / algorithm / value


def _manifest(archive: Path, layout: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest: dict[str, Any] = json.loads(_blob(layout, entry["digest"]).read_text())
    return manifest


def _unpack(archive: Path, into: Path) -> dict[str, Any]:
    """The root filesystem under ``into/rootfs``; the image's config."""
    layout, rootfs = into / "layout", into / "rootfs"
    rootfs.mkdir(parents=True)
    manifest = _manifest(archive, layout)
    for layer in manifest["layers"]:
        # GNU tar as root keeps owners, modes and device nodes, as a runtime does.
        subprocess.run(
            ["tar", "--extract", "--file", str(_blob(layout, layer["digest"])), "-C", str(rootfs)],
            check=True,
            timeout=300,
        )
    # This unpacker applies no whiteouts: an image that needs them must fail here.
    whiteouts = subprocess.run(
        ["find", str(rootfs), "-name", ".wh.*"], capture_output=True, text=True, check=True
    )
    assert whiteouts.stdout == ""
    config: dict[str, Any] = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    return config


def _run_as_configured(rootfs: Path, config: dict[str, Any], *args: str) -> str:
    settings = config["config"]
    env = dict(item.split("=", 1) for item in settings["Env"])
    done = subprocess.run(
        [CHROOT, f"--userspec={settings['User']}", str(rootfs), *settings["Entrypoint"], *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_kmm_runs_in_the_unpacked_image_as_its_non_root_user(archive: Path, tmp_path: Path) -> None:
    config = _unpack(archive, tmp_path)
    settings = config["config"]
    assert settings["User"] == "65532:65532"  # deploy/'s runAsUser
    rootfs = tmp_path / "rootfs"
    passwd = (rootfs / "etc" / "passwd").read_text().splitlines()
    assert "kmm:x:65532:65532:kmm:/nonexistent:/usr/sbin/nologin" in passwd
    assert settings["Entrypoint"] == ["kmm"]

    assert "Usage: kmm [OPTIONS] COMMAND" in _run_as_configured(rootfs, config, "--help")
    assert "Usage: kmm operator [OPTIONS]" in _run_as_configured(
        rootfs, config, "operator", "--help"
    )
    # Every command is there: the driver, the emulator, the sandbox...
    listed = _run_as_configured(rootfs, config, "--help")
    for command in ("operator", "driver", "kubelet", "modules", "upgrade", "manifests"):
        assert command in listed
    # ...and as that user: chroot's --userspec took, nothing ran as root.
    whoami = subprocess.run(
        [CHROOT, f"--userspec={settings['User']}", str(rootfs), "/usr/bin/id", "-u"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert whoami.stdout.strip() == "65532"


def test_the_same_commit_builds_the_same_layers(
    archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    again = _build(tmp_path_factory.mktemp("again") / "kmm-image.tar")
    first = _manifest(archive, tmp_path_factory.mktemp("first"))
    second = _manifest(again, tmp_path_factory.mktemp("second"))
    assert [layer["digest"] for layer in second["layers"]] == [
        layer["digest"] for layer in first["layers"]
    ]
    # The config too (times, user, labels): the whole image has one digest.
    assert second == first
