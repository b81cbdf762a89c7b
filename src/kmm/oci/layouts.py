"""An OCI image layout directory: ``oci-layout``, ``index.json`` and
``blobs/sha256/<hex>``, holding one image.

``add_gzip_layer`` writes a layer from an uncompressed tar stream in one
pass that digests both forms (the blob's digest, and the ``diff_id`` its
config lists), so a root filesystem of hundreds of MB is read once and
never held in memory; ``write_image`` adds the config and the manifest and
names the image in ``index.json``. ``read`` gives the image back as
descriptors, checking each blob is there with its size (not its digest:
that would read every layer again).

What ``make vm-toolkit-images`` makes of a toolkit tarball
(``kmm.sandbox.vmnodes.toolkitimages``) and what the sandbox seeds its
registry from (``kmm.sandbox.registryseeding``). Limits: one image per
layout, linux/amd64; sha256 only; gzip layers (zlib, so the same tar and
level give the same blob).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

from kmm.oci import mediatypes
from kmm.oci.archive import REF_NAME
from kmm.oci.descriptors import Descriptor, check_digest, sha256_digest

__all__ = [
    "CONFIG",
    "GZIP_LAYER",
    "Image",
    "Layer",
    "add_blob",
    "add_gzip_layer",
    "blob_path",
    "image_config",
    "read",
    "write_image",
]

CONFIG: Final = "application/vnd.oci.image.config.v1+json"
GZIP_LAYER: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
_LAYOUT_VERSION: Final = "1.0.0"
_CHUNK: Final = 1 << 20
# zlib's gzip wrapper (wbits 16 + 15): a header without a name or a time.
_GZIP_WBITS: Final = 31


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer blob and the digest of its uncompressed tar (``diff_id``)."""

    descriptor: Descriptor
    diff_id: str


@dataclasses.dataclass(frozen=True)
class Image:
    """The image of a layout: its manifest and the blobs it names (config first)."""

    manifest: Descriptor
    blobs: tuple[Descriptor, ...]
    ref_name: str


def blob_path(directory: Path, digest: str) -> Path:
    return directory / "blobs" / "sha256" / check_digest(digest).removeprefix("sha256:")


def _place(directory: Path, partial: Path, digest: str) -> Path:
    """Rename ``partial`` to the blob of ``digest``, read-only (a registry
    seeded from it may link it: nobody is to write it in place)."""
    target = blob_path(directory, digest)
    partial.chmod(0o444)
    partial.replace(target)
    return target


def _blobs(directory: Path) -> Path:
    found = directory / "blobs" / "sha256"
    found.mkdir(parents=True, exist_ok=True)
    return found


def add_blob(directory: Path, data: bytes, media_type: str) -> Descriptor:
    """``data`` as a blob of the layout; its descriptor."""
    digest = sha256_digest(data)
    partial = _blobs(directory) / f".{digest.removeprefix('sha256:')}.partial"
    partial.write_bytes(data)
    _place(directory, partial, digest)
    return Descriptor(media_type, digest, len(data))


def add_gzip_layer(directory: Path, tar: IO[bytes], *, level: int = 6) -> Layer:
    """The uncompressed tar read from ``tar``, gzip-compressed as a layer blob."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
    plain, packed = hashlib.sha256(), hashlib.sha256()
    size = 0
    partial = _blobs(directory) / f".layer-{os.getpid()}.partial"
    with partial.open("wb") as out:
        while chunk := tar.read(_CHUNK):
            plain.update(chunk)
            data = compressor.compress(chunk)
            packed.update(data)
            out.write(data)
            size += len(data)
        data = compressor.flush()
        packed.update(data)
        out.write(data)
        size += len(data)
    digest = f"sha256:{packed.hexdigest()}"
    _place(directory, partial, digest)
    return Layer(Descriptor(GZIP_LAYER, digest, size), f"sha256:{plain.hexdigest()}")


def image_config(
    layers: Sequence[Layer],
    *,
    created: str,
    env: Sequence[str] = (),
    cmd: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    history: str = "",
) -> dict[str, Any]:
    """An OCI image config (linux/amd64) of ``layers``, in order."""
    config: dict[str, Any] = {"Env": list(env), "Cmd": list(cmd), "WorkingDir": "/"}
    if labels:
        config["Labels"] = dict(labels)
    return {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": created, "created_by": history} for _ in layers],
    }


def _dump(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(found: Descriptor) -> dict[str, Any]:
    return {"mediaType": found.media_type, "digest": found.digest, "size": found.size}


def write_image(
    directory: Path, config: Mapping[str, Any], layers: Sequence[Layer], *, ref_name: str
) -> Descriptor:
    """The image of ``config`` and ``layers`` (already added) as the
    layout's one image, named ``ref_name`` in ``index.json``; its manifest."""
    config_blob = add_blob(directory, _dump(config), CONFIG)
    manifest = {
        "schemaVersion": 2,
        # Named in the body too: a registry serves a stored manifest by it.
        "mediaType": mediatypes.OCI_MANIFEST,
        "config": _descriptor(config_blob),
        "layers": [_descriptor(layer.descriptor) for layer in layers],
    }
    top = add_blob(directory, _dump(manifest), mediatypes.OCI_MANIFEST)
    index = {
        "schemaVersion": 2,
        "mediaType": mediatypes.OCI_INDEX,
        "manifests": [{**_descriptor(top), "annotations": {REF_NAME: ref_name}}],
    }
    (directory / "index.json").write_bytes(_dump(index))
    (directory / "oci-layout").write_bytes(_dump({"imageLayoutVersion": _LAYOUT_VERSION}))
    return top


def _load(path: Path, what: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} ({what}) is not readable JSON: {err}") from err
    if not isinstance(document, dict):
        raise ValueError(f"{path} ({what}) is not a JSON object")
    return document


def _present(directory: Path, found: Descriptor) -> Descriptor:
    path = blob_path(directory, found.digest)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ValueError(f"{directory}: blob {found.digest} is missing ({err})") from err
    if size != found.size:
        raise ValueError(f"{directory}: blob {found.digest} has {size} bytes, not {found.size}")
    return found


def read(directory: Path) -> Image:
    """The layout's one image; ValueError when the layout is not one of an
    image whose blobs are all there."""
    index = _load(directory / "index.json", "the image index")
    entries = index.get("manifests") or []
    if len(entries) != 1:
        raise ValueError(f"{directory}: index.json lists {len(entries)} images, not one")
    top = _present(directory, Descriptor.parse(entries[0], "index.json manifests[0]"))
    if top.media_type != mediatypes.OCI_MANIFEST:
        raise ValueError(f"{directory}: {top.digest} is a {top.media_type}, not an image manifest")
    if sha256_digest(blob_path(directory, top.digest).read_bytes()) != top.digest:
        raise ValueError(f"{directory}: manifest {top.digest} is corrupt")
    manifest = _load(blob_path(directory, top.digest), "the manifest")
    children = [Descriptor.parse(manifest.get("config"), f"{top.digest} config")]
    children += [
        Descriptor.parse(entry, f"{top.digest} layers[{i}]")
        for i, entry in enumerate(manifest.get("layers") or [])
    ]
    return Image(
        manifest=top,
        blobs=tuple(_present(directory, child) for child in children),
        ref_name=str(top.annotations.get(REF_NAME, "")),
    )
