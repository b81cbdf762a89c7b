"""Images put into the registry's storage before it starts
(kmm.sandbox.registryseeding): distribution's filesystem layout, blobs
linked from the cache. The registry serving them is
tests/integration/test_registry_seeding.py."""

from __future__ import annotations

import errno
import io
import os
import tarfile
from pathlib import Path

import pytest

from kmm.oci import layouts
from kmm.sandbox import pki, processes, registry, registryseeding


def _layout(directory: Path, body: bytes = b"x") -> layouts.Image:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as made:
        entry = tarfile.TarInfo("f")
        entry.size = len(body)
        made.addfile(entry, io.BytesIO(body))
    layer = layouts.add_gzip_layer(directory, io.BytesIO(out.getvalue()))
    config = layouts.image_config([layer], created="2025-01-01T00:00:00Z")
    layouts.write_image(directory, config, [layer], ref_name="kmm/t:1")
    return layouts.read(directory)


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def test_an_image_is_written_as_the_registry_stores_a_push(tmp_path: Path) -> None:
    image = _layout(tmp_path / "layout")
    data = tmp_path / "data"
    registryseeding.seed(data, [registryseeding.Seed(tmp_path / "layout", "kmm/driver-toolkit", "6.1.0-1-amd64")])  # fmt: skip
    root = data / "docker" / "registry" / "v2"
    for blob in (image.manifest, *image.blobs):
        stored = root / "blobs" / "sha256" / _hex(blob.digest)[:2] / _hex(blob.digest) / "data"
        cached = layouts.blob_path(tmp_path / "layout", blob.digest)
        assert stored.read_bytes() == cached.read_bytes()
        assert stored.stat().st_ino == cached.stat().st_ino  # linked, not copied
    repository = root / "repositories" / "kmm" / "driver-toolkit"
    for blob in image.blobs:  # config and layers
        link = repository / "_layers" / "sha256" / _hex(blob.digest) / "link"
        assert link.read_text() == blob.digest
    top = image.manifest.digest
    manifests = repository / "_manifests"
    assert (manifests / "revisions" / "sha256" / _hex(top) / "link").read_text() == top
    tag = manifests / "tags" / "6.1.0-1-amd64"
    assert (tag / "current" / "link").read_text() == top
    assert (tag / "index" / "sha256" / _hex(top) / "link").read_text() == top
    assert registryseeding.tags(data, "kmm/driver-toolkit") == ["6.1.0-1-amd64"]
    assert registryseeding.tags(data, "kmm/other") == []


def test_across_file_systems_a_blob_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _layout(tmp_path / "layout")

    def cross_device(source: object, target: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(registryseeding.os, "link", cross_device)
    data = tmp_path / "data"
    registryseeding.seed(data, [registryseeding.Seed(tmp_path / "layout", "kmm/t", "1")])
    layer = image.blobs[1].digest
    stored = data / "docker/registry/v2/blobs/sha256" / _hex(layer)[:2] / _hex(layer) / "data"
    assert stored.read_bytes() == layouts.blob_path(tmp_path / "layout", layer).read_bytes()


def test_two_tags_of_one_repository_share_what_they_have_in_common(tmp_path: Path) -> None:
    _layout(tmp_path / "a", b"a")
    _layout(tmp_path / "b", b"b")
    data = tmp_path / "data"
    seeds = [
        registryseeding.Seed(tmp_path / "a", "kmm/t", "a"),
        registryseeding.Seed(tmp_path / "b", "kmm/t", "b"),
    ]
    registryseeding.seed(data, seeds)
    registryseeding.seed(data, seeds)  # again: nothing changes, nothing fails
    assert registryseeding.tags(data, "kmm/t") == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "tag", "why"),
    [("Kmm/T", "1", "not a repository name"), ("kmm/t", "6.12+deb12", "not a tag")],
)
def test_a_name_or_tag_a_registry_refuses_is_refused(
    tmp_path: Path, name: str, tag: str, why: str
) -> None:
    _layout(tmp_path / "layout")
    with pytest.raises(ValueError, match=why):
        registryseeding.seed(tmp_path / "data", [registryseeding.Seed(tmp_path / "layout", name, tag)])  # fmt: skip


def test_the_registry_starts_with_its_seeds_in_the_storage_it_serves(tmp_path: Path) -> None:
    _layout(tmp_path / "layout")

    def launch(name: str, argv: list[str], *, health_url: str) -> processes.Process:
        return processes.Process(name, 0, -1, tmp_path / "log", tuple(argv), health_url)

    credentials = pki.create(tmp_path / "pki", ())
    sandbox = tmp_path / "sandbox"
    seeds = [registryseeding.Seed(tmp_path / "layout", "kmm/t", "1")]
    registry.start(launch, sandbox, Path("/bin/registry"), credentials, auth=None, seeds=seeds)
    assert registryseeding.tags(registry.storage(sandbox), "kmm/t") == ["1"]
    config = (sandbox / "registry" / "config.yml").read_text()
    assert f"rootdirectory: {registry.storage(sandbox)}" in config
