"""Reading the OCI archives `make image` and `make test-images` write.

The tests of tests/image open an archive as a runtime would (OCI layout ->
index -> manifest -> config and layers in order) and unpack its layers into
a root filesystem. They build nothing: an archive that is missing fails the
test with the make target that writes it.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"


@dataclass(frozen=True)
class Image:
    """One image of an archive: its index entry, manifest and config."""

    layout: Path
    reference: str
    manifest: dict[str, Any]
    config: dict[str, Any]

    def blob(self, digest: str) -> Path:
        algorithm, value = digest.split(":")
        return self.layout / "blobs" / algorithm / value

    @property
    def layers(self) -> list[Path]:
        return [self.blob(layer["digest"]) for layer in self.manifest["layers"]]


def required(path: Path, *, target: str) -> Path:
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make {target}` (make test does) before pytest")
    return path


def open_image(archive: Path, into: Path) -> Image:
    """The archive's one image, its layout extracted under ``into``."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (entry,) = json.loads((into / "index.json").read_text())["manifests"]
    reference = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")

    def read(digest: str) -> dict[str, Any]:
        algorithm, value = digest.split(":")
        found: dict[str, Any] = json.loads((into / "blobs" / algorithm / value).read_text())
        return found

    manifest = read(entry["digest"])
    return Image(into, reference, manifest, read(manifest["config"]["digest"]))


def unpack(image: Image, rootfs: Path) -> Path:
    """The image's root filesystem under ``rootfs``, layers applied in order."""
    rootfs.mkdir(parents=True)
    for layer in image.layers:
        # GNU tar as root keeps owners, modes and device nodes, as a runtime does.
        subprocess.run(
            ["tar", "--extract", "--file", str(layer), "-C", str(rootfs)], check=True, timeout=300
        )
    # This unpacker applies no whiteouts: an image that needs them must fail here.
    whiteouts = subprocess.run(
        ["find", str(rootfs), "-name", ".wh.*"], capture_output=True, text=True, check=True
    )
    assert whiteouts.stdout == ""
    return rootfs
