"""Reading OCI archives laid out as `buildah commit ... oci-archive:` writes them."""

from __future__ import annotations

import tarfile
from pathlib import Path

import ociarchives
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmm.oci import archive, mediatypes


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contents=st.lists(st.binary(max_size=200), min_size=0, max_size=3),
    docker=st.booleans(),
)
def test_the_image_and_its_blobs_read_back(
    tmp_path: Path, contents: list[bytes], docker: bool
) -> None:
    layers = [ociarchives.layer({"file": data}) for data in contents]
    made = ociarchives.write(tmp_path / "image.tar", layers, docker=docker)
    with archive.Archive(made.path) as image:
        [top] = image.manifests
        assert top.digest == made.manifest_digest
        assert top.media_type == (mediatypes.DOCKER_MANIFEST if docker else mediatypes.OCI_MANIFEST)
        assert top.annotations[archive.REF_NAME] == "latest"
        children = image.children(top)
        assert tuple(child.digest for child in children) == made.blob_digests
        assert [image.blob(child) for child in children[1:]] == layers


def test_a_leading_dot_slash_is_accepted(tmp_path: Path) -> None:
    plain = ociarchives.write(tmp_path / "plain.tar", [ociarchives.layer({"a": b"1"})])
    dotted = tmp_path / "dotted.tar"
    with tarfile.open(plain.path) as source, tarfile.open(dotted, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member)
            member.name = f"./{member.name}"
            target.addfile(member, data)
    with archive.Archive(dotted) as image:
        assert image.manifests[0].digest == plain.manifest_digest


@pytest.mark.parametrize(
    ("drop", "message"),
    [(("oci-layout",), "no oci-layout"), (("index.json",), "no index.json")],
)
def test_a_tar_without_the_layout_is_not_an_archive(
    tmp_path: Path, drop: tuple[str, ...], message: str
) -> None:
    made = ociarchives.write(tmp_path / "image.tar", [], drop=drop)
    with pytest.raises(archive.NotAnArchive, match=message):
        archive.Archive(made.path)


def test_a_file_that_is_no_tar_is_named(tmp_path: Path) -> None:
    path = tmp_path / "image.tar"
    path.write_bytes(b"hello")
    with pytest.raises(archive.NotAnArchive, match="not a readable tar archive"):
        archive.Archive(path)


def test_a_missing_or_corrupt_blob_is_named(tmp_path: Path) -> None:
    data = ociarchives.layer({"a": b"1"})
    made = ociarchives.write(tmp_path / "image.tar", [data])
    layer_member = f"blobs/sha256/{made.blob_digests[1].removeprefix('sha256:')}"
    corrupt = ociarchives.write(
        tmp_path / "corrupt.tar", [data], extra_members={layer_member: b"other bytes"}
    )
    with archive.Archive(corrupt.path) as image:
        layer = image.children(image.manifests[0])[1]
        with pytest.raises(archive.NotAnArchive, match=f"blob {layer.digest} is corrupt"):
            image.blob(layer)
    missing = ociarchives.write(tmp_path / "missing.tar", [data], drop=(layer_member,))
    with archive.Archive(missing.path) as image:
        layer = image.children(image.manifests[0])[1]
        with pytest.raises(archive.NotAnArchive, match=f"no {layer_member}"):
            image.blob(layer)


def test_an_empty_index_is_not_an_image(tmp_path: Path) -> None:
    made = ociarchives.write(
        tmp_path / "image.tar", [], extra_members={"index.json": b'{"schemaVersion": 2}'}
    )
    with pytest.raises(archive.NotAnArchive, match="lists no manifest"):
        archive.Archive(made.path)
