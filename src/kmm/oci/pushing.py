"""Copy the image of an OCI archive to a repository of a registry.

Blobs first (each asked for with a HEAD and skipped when the repository has
it), then manifests bottom-up: an index's manifests by digest, the top one by
tag, so the tag never names an image whose parts are not there yet.

Limits: the archive's ``index.json`` must list exactly one image (what
``buildah commit ... oci-archive:`` writes); blobs are uploaded one at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from kmm.oci import mediatypes
from kmm.oci.archive import Archive, NotAnArchive
from kmm.oci.client import Client, check_name, check_reference
from kmm.oci.descriptors import Descriptor

__all__ = ["Progress", "push"]

# Told one line per step: "uploading blob sha256:... (123 bytes)".
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _top(archive: Archive) -> Descriptor:
    if len(archive.manifests) != 1:
        raise NotAnArchive(
            f"{archive.path} holds {len(archive.manifests)} images in index.json; "
            "one is pushed at a time"
        )
    return archive.manifests[0]


async def _push_manifest(
    client: Client,
    archive: Archive,
    name: str,
    descriptor: Descriptor,
    reference: str,
    progress: Progress,
) -> None:
    for child in archive.children(descriptor):
        if descriptor.media_type in mediatypes.INDEXES:
            await _push_manifest(client, archive, name, child, child.digest, progress)
        elif await client.blob_exists(name, child.digest):
            progress(f"blob {child.digest} already there")
        else:
            progress(f"uploading blob {child.digest} ({child.size} bytes)")
            await client.upload_blob(name, child.digest, archive.blob(child))
    progress(f"putting manifest {descriptor.digest} as {name}:{reference}")
    await client.put_manifest(name, reference, descriptor.media_type, archive.blob(descriptor))


async def push(
    client: Client, archive: Archive, name: str, tag: str, *, progress: Progress = _quiet
) -> Descriptor:
    """Push the archive's image as ``name:tag``; the descriptor of its top manifest."""
    check_name(name)
    check_reference(tag)
    top = _top(archive)
    await _push_manifest(client, archive, name, top, tag, progress)
    return top
