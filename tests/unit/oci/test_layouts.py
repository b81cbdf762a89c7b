"""OCI image layout directories (kmm.oci.layouts): one image written from an
uncompressed tar, read back as descriptors."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from kmm.oci import archive, layouts, mediatypes


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as made:
        for name, body in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(body)
            made.addfile(entry, io.BytesIO(body))
    return out.getvalue()


def _image(directory: Path) -> tuple[layouts.Image, list[bytes]]:
    tars = [_tar({"etc/a": b"a" * 3_000_000}), _tar({"etc/b": b"b"})]
    layers = [layouts.add_gzip_layer(directory, io.BytesIO(t)) for t in tars]
    config = layouts.image_config(
        layers, created="2025-01-01T00:00:00Z", env=("PATH=/bin",), cmd=("/bin/sh",),
        labels={"k": "v"}, history="test",
    )  # fmt: skip
    top = layouts.write_image(directory, config, layers, ref_name="kmm/x:1")
    found = layouts.read(directory)
    assert found.manifest.digest == top.digest
    return found, tars


def test_a_layer_is_the_gzip_of_its_tar_and_the_config_lists_its_diff_id(tmp_path: Path) -> None:
    found, tars = _image(tmp_path)
    config_blob, *layers = found.blobs
    assert config_blob.media_type == layouts.CONFIG
    config = json.loads(layouts.blob_path(tmp_path, config_blob.digest).read_bytes())
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Labels"] == {"k": "v"}
    assert config["config"]["Env"] == ["PATH=/bin"]
    for layer, tar in zip(layers, tars, strict=True):
        assert layer.media_type == layouts.GZIP_LAYER
        data = layouts.blob_path(tmp_path, layer.digest).read_bytes()
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == layer.digest
        assert len(data) == layer.size
        assert gzip.decompress(data) == tar
    # The first layer's 3 MB of one byte: compressed, over several chunks.
    assert layers[0].size < 100_000


def test_the_index_names_the_image_and_the_manifest_its_type(tmp_path: Path) -> None:
    found, _ = _image(tmp_path)
    assert found.ref_name == "kmm/x:1"
    index = json.loads((tmp_path / "index.json").read_bytes())
    assert index["manifests"][0]["annotations"] == {archive.REF_NAME: "kmm/x:1"}
    manifest = json.loads(layouts.blob_path(tmp_path, found.manifest.digest).read_bytes())
    assert manifest["mediaType"] == mediatypes.OCI_MANIFEST
    assert json.loads((tmp_path / "oci-layout").read_bytes()) == {"imageLayoutVersion": "1.0.0"}


def test_blobs_are_read_only_and_the_same_input_makes_the_same_image(tmp_path: Path) -> None:
    first, _ = _image(tmp_path / "a")
    second, _ = _image(tmp_path / "b")
    assert first == second
    for blob in (first.manifest, *first.blobs):
        assert layouts.blob_path(tmp_path / "a", blob.digest).stat().st_mode & 0o777 == 0o444


def test_a_layout_with_a_missing_or_cut_blob_is_refused(tmp_path: Path) -> None:
    found, _ = _image(tmp_path)
    layer = layouts.blob_path(tmp_path, found.blobs[1].digest)
    layer.chmod(0o644)
    layer.write_bytes(layer.read_bytes()[:-1])
    with pytest.raises(ValueError, match="bytes, not"):
        layouts.read(tmp_path)
    layer.unlink()
    with pytest.raises(ValueError, match="is missing"):
        layouts.read(tmp_path)
    with pytest.raises(ValueError, match="not readable JSON"):
        layouts.read(tmp_path / "nothing")
