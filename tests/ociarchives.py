"""Tiny OCI archives made with tarfile, as ``buildah commit ... oci-archive:``
lays them out (oci-layout, index.json, blobs/sha256/<hex>): what the OCI
tests push and read, without running buildah."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from pathlib import Path

from kmm.oci import mediatypes

__all__ = ["Made", "layer", "write"]


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def layer(files: dict[str, bytes]) -> bytes:
    """An uncompressed layer tar holding ``files``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class Made:
    path: Path
    manifest_digest: str
    blob_digests: tuple[str, ...]  # config first, then layers


def write(
    path: Path,
    layers: list[bytes],
    *,
    docker: bool = False,
    extra_members: dict[str, bytes] | None = None,
    drop: tuple[str, ...] = (),
) -> Made:
    """Write an archive of one image with ``layers``; Docker's media types
    when ``docker``. ``extra_members`` adds or replaces members, ``drop``
    leaves some out (for broken archives)."""
    layer_type = (
        "application/vnd.docker.image.rootfs.diff.tar"
        if docker
        else "application/vnd.oci.image.layer.v1.tar"
    )
    config_type = (
        "application/vnd.docker.container.image.v1+json"
        if docker
        else "application/vnd.oci.image.config.v1+json"
    )
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/hello"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(data) for data in layers]},
        }
    ).encode()
    manifest_type = mediatypes.DOCKER_MANIFEST if docker else mediatypes.OCI_MANIFEST
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": _digest(config), "size": len(config)},
            "layers": [
                {"mediaType": layer_type, "digest": _digest(data), "size": len(data)}
                for data in layers
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": manifest_type,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": "latest"},
                }
            ],
        }
    ).encode()
    members = {
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
        "index.json": index,
        **{
            f"blobs/sha256/{_digest(data).removeprefix('sha256:')}": data
            for data in (config, manifest, *layers)
        },
        **(extra_members or {}),
    }
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            if name in drop:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return Made(path, _digest(manifest), (_digest(config), *(_digest(data) for data in layers)))
