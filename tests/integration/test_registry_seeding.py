"""A registry whose storage was seeded before it started
(kmm.sandbox.registryseeding) serves the image as if it had been pushed,
and its API's writes never reach the cache's files.

The real distribution binary on loopback, alone (as in
test_sandbox_registry.py): a control plane buys nothing here. The VM nodes'
driver toolkit images seeded this way, and pulled by a node, are
test_vm_nodes.py's.
"""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kmm.cli import paths
from kmm.oci import client as oci_client
from kmm.oci import errors, layouts, mediatypes
from kmm.sandbox import building, components, health, pki, processes, registry, registryseeding

NAME, TAG = "kmm/driver-toolkit", "6.12.57_deb12-amd64"


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as made:
        for name, body in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(body)
            made.addfile(entry, io.BytesIO(body))
    return out.getvalue()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("layout")
    layers = [
        layouts.add_gzip_layer(directory, io.BytesIO(_tar({"usr/bin/tool": b"t" * 200_000}))),
        layouts.add_gzip_layer(directory, io.BytesIO(_tar({"etc/release": b"r"}))),
    ]
    config = layouts.image_config(layers, created="2025-01-01T00:00:00Z")
    layouts.write_image(directory, config, layers, ref_name=f"{NAME}:{TAG}")
    return directory


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, layout: Path) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("seeded")
    launched: list[processes.Process] = []

    def launch(name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=directory / "logs" / f"{name}.log", health_url=health_url
        )
        launched.append(process)
        return process

    binary = asyncio.run(building.ensure_built(paths.cache_dir(), (components.REGISTRY,)))
    process, record = registry.start(
        launch, directory, binary["registry"], pki.create(directory / "pki", ()), auth=None,
        seeds=[registryseeding.Seed(layout, NAME, TAG)],
    )  # fmt: skip
    try:
        asyncio.run(health.wait_healthy(process, timeout=120))
        (directory / "port").write_text(str(record.host_port))
        yield directory
    finally:
        for each in launched:
            each.stop()


@pytest.fixture
async def client(seeded: Path) -> AsyncIterator[oci_client.Client]:
    port = (seeded / "port").read_text()
    ca = pki.Pki(seeded / "pki").ca_cert
    async with oci_client.Client(f"127.0.0.1:{port}", ca_files=(ca,)) as found:
        yield found


def _requests(directory: Path) -> list[str]:
    log = (directory / "logs" / f"{registry.COMPONENT}.log").read_text()
    return re.findall(r'"(GET|HEAD|POST|PUT|PATCH|DELETE) \S+ HTTP', log)


async def test_the_seeded_image_is_served_as_built(
    client: oci_client.Client, layout: Path, seeded: Path
) -> None:
    image = layouts.read(layout)
    found = await client.head_manifest(NAME, TAG)
    assert (found.digest, found.media_type) == (image.manifest.digest, mediatypes.OCI_MANIFEST)
    _, body = await client.get_manifest(NAME, TAG)
    assert body == layouts.blob_path(layout, image.manifest.digest).read_bytes()
    assert (await client.get_manifest(NAME, image.manifest.digest))[1] == body
    for blob in image.blobs:
        assert await client.get_blob(NAME, blob.digest) == layouts.blob_path(layout, blob.digest).read_bytes()  # fmt: skip
    # Served from what was linked in, nothing uploaded.
    assert not {"POST", "PUT", "PATCH"} & set(_requests(seeded))
    # Another repository has no link to these blobs.
    assert not await client.blob_exists("kmm/other", image.blobs[1].digest)


async def test_writes_through_the_api_leave_the_cache_as_it_was(
    client: oci_client.Client, layout: Path
) -> None:
    image = layouts.read(layout)
    layer = image.blobs[1]
    cached = layouts.blob_path(layout, layer.digest)
    before = (cached.read_bytes(), cached.stat().st_ino)
    # A push of a blob the registry has, and of the manifest under a second tag.
    await client.upload_blob(NAME, layer.digest, cached.read_bytes())
    body = layouts.blob_path(layout, image.manifest.digest).read_bytes()
    await client.put_manifest(NAME, "again", mediatypes.OCI_MANIFEST, body)
    assert (await client.head_manifest(NAME, "again")).digest == image.manifest.digest
    # Deleting the manifest removes the tags, never the cache's blobs.
    await client.delete_manifest(NAME, image.manifest.digest)
    with pytest.raises(errors.NotFound):
        await client.head_manifest(NAME, TAG)
    assert (cached.read_bytes(), cached.stat().st_ino) == before
    assert layouts.read(layout) == image
