"""Driver toolkit images (kmm.sandbox.vmnodes.toolkitimages): a toolkit
tarball made an OCI image, cached by content, named for the operator's
template, and what a sandbox's registry is seeded with. The real toolkits
are `make vm-toolkit-images`' (tests/integration/test_vm_nodes.py pulls one)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from kmm.api import kernels as api_kernels
from kmm.oci import layouts
from kmm.operator.build import toolkit
from kmm.sandbox import registry, registryseeding
from kmm.sandbox.vmnodes import kernels, toolkitimages

CHOSEN = kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64"))
DEBIAN = "6.12.118+deb12-amd64"


def _toolkit(path: Path) -> Path:
    with tarfile.open(path, "w") as made:
        for name, body in {"./usr/src/linux-headers-x/Makefile": b"all:\n"}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(body)
            made.addfile(entry, io.BytesIO(body))
    return path


def _files(layout: Path, layer: layouts.Descriptor) -> dict[str, bytes]:
    data = gzip.decompress(layouts.blob_path(layout, layer.digest).read_bytes())
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {
            m.name: (archive.extractfile(m) or io.BytesIO()).read()
            for m in archive.getmembers()
            if m.isfile()
        }


def test_the_image_is_the_toolkit_and_the_release_file_named_for_its_kernel(tmp_path: Path) -> None:
    toolkit_tar = _toolkit(tmp_path / "toolkit.tar")
    layout = toolkitimages.build(tmp_path, CHOSEN, DEBIAN, toolkit_tar)
    image = layouts.read(layout)
    assert image.ref_name == "kmm/driver-toolkit:6.12.118_deb12-amd64"
    config_blob, base, release = image.blobs
    # The toolkit tarball as it is is the first layer.
    assert (
        gzip.decompress(layouts.blob_path(layout, base.digest).read_bytes())
        == toolkit_tar.read_bytes()
    )
    assert json.loads(_files(layout, release)["etc/driver-toolkit-release.json"]) == {
        "KERNEL_VERSION": DEBIAN
    }
    config = json.loads(layouts.blob_path(layout, config_blob.digest).read_bytes())
    assert config["config"]["Labels"]["kmm.driver-toolkit.kernel"] == DEBIAN
    assert config["config"]["Cmd"] == ["/bin/bash"]


def test_it_is_cached_by_content_under_the_kernel_lists_key(tmp_path: Path) -> None:
    assert toolkitimages.find(tmp_path, CHOSEN, DEBIAN) is None
    layout = toolkitimages.build(tmp_path, CHOSEN, DEBIAN, _toolkit(tmp_path / "t.tar"))
    assert layout.parent == tmp_path / "vm"
    assert layout.name.startswith("toolkit-image-6.12.118_deb12-amd64-")
    assert toolkitimages.find(tmp_path, CHOSEN, DEBIAN) == layout
    made = (layout / "index.json").stat().st_mtime_ns
    assert toolkitimages.build(tmp_path, CHOSEN, DEBIAN, tmp_path / "gone.tar") == layout
    assert (layout / "index.json").stat().st_mtime_ns == made
    # Another kernel list (a security update) names another image.
    newer = kernels.KernelList(versions=("6.1.0-58-amd64", DEBIAN))
    assert toolkitimages.image_key(newer, DEBIAN) != toolkitimages.image_key(CHOSEN, DEBIAN)
    assert toolkitimages.find(tmp_path, newer, DEBIAN) is None


def test_the_operators_template_names_each_kernels_image() -> None:
    toolkit.check_template(toolkitimages.TEMPLATE)
    for kernel in CHOSEN.versions:
        values = api_kernels.variables(kernel, module_name="m", module_namespace="ns")
        expanded = api_kernels.expand(toolkitimages.TEMPLATE, values)
        assert expanded == toolkitimages.reference(CHOSEN, kernel)
    assert toolkitimages.reference(CHOSEN, DEBIAN) == (
        "10.253.0.1:5000/kmm/driver-toolkit:6.12.118_deb12-amd64"
    )


def test_a_sandbox_is_seeded_with_the_images_built_and_says_which_it_lacks(tmp_path: Path) -> None:
    toolkitimages.build(tmp_path, CHOSEN, DEBIAN, _toolkit(tmp_path / "t.tar"))
    seeds, missing = toolkitimages.seeds(tmp_path, CHOSEN)
    assert missing == ["6.1.0-57-amd64"]
    assert [(s.name, s.tag) for s in seeds] == [("kmm/driver-toolkit", "6.12.118_deb12-amd64")]
    sandbox = tmp_path / "sandbox"
    registryseeding.seed(registry.storage(sandbox), seeds)
    assert toolkitimages.served(sandbox, CHOSEN) == (
        ["10.253.0.1:5000/kmm/driver-toolkit:6.12.118_deb12-amd64"],
        ["6.1.0-57-amd64"],
    )


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        toolkitimages.build(tmp_path, CHOSEN, DEBIAN, tmp_path / "missing.tar")
    assert sorted((tmp_path / "vm").iterdir()) == []
