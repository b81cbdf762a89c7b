"""kmm's image: the archive `make image` built, run without a container engine.

The archive is unpacked as a runtime would (OCI layout -> manifest -> layers
in order) into a root filesystem, and kmm runs there under chroot as the
user the image's config names. `make image-again` built it a second time
from the same commit: the two have the same layers. Nothing is built here:
each archive must be there and built from the work tree's sources (the
digest ``scripts/image_inputs.py`` computes, which the build records in the
label ``kmm.image.inputs``), or the test fails saying which make target to
run. Needs root for chroot (CI runs as root).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import imagearchives
import pytest

INPUTS = imagearchives.ROOT / "scripts" / "image_inputs.py"
ARCHIVE = imagearchives.BUILD / "kmm-image.tar"
AGAIN = imagearchives.BUILD / "kmm-image-again.tar"
# Looked up here: the command runs with the image's environment, not ours.
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def _work_tree_inputs() -> str:
    done = subprocess.run(
        [sys.executable, str(INPUTS)], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def fresh(archive: Path, into: Path, *, target: str) -> imagearchives.Image:
    """The archive's image, failing when it was built from other sources."""
    image = imagearchives.open_image(imagearchives.required(archive, target=target), into)
    recorded = (image.config["config"].get("Labels") or {}).get("kmm.image.inputs")
    expected = _work_tree_inputs()
    if recorded != expected:
        pytest.fail(
            f"{archive} is stale: built from inputs {recorded}, the work tree's are {expected} "
            f"(src, pyproject.toml, README.md, the build scripts, .venv's versions): "
            f"run `make {target}` (make test does) before pytest"
        )
    return image


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


def test_kmm_runs_in_the_unpacked_image_as_its_non_root_user(tmp_path: Path) -> None:
    image = fresh(ARCHIVE, tmp_path / "layout", target="image")
    config = image.config
    settings = config["config"]
    assert settings["User"] == "65532:65532"  # deploy/'s runAsUser
    rootfs = imagearchives.unpack(image, tmp_path / "rootfs")
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


def test_the_same_commit_builds_the_same_layers(tmp_path: Path) -> None:
    first = fresh(ARCHIVE, tmp_path / "first", target="image")
    second = fresh(AGAIN, tmp_path / "second", target="image-again")
    assert [layer["digest"] for layer in second.manifest["layers"]] == [
        layer["digest"] for layer in first.manifest["layers"]
    ]
    # The config too (times, user, labels): the whole image has one digest.
    assert second.manifest == first.manifest
    assert second.config == first.config
