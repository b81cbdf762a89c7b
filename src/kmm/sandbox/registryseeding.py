"""Images put into the sandbox registry's storage before it starts, not pushed.

The driver toolkit images VM nodes build with are about 120 MiB each,
compressed (``vmnodes.toolkitimages``): pushing them into every sandbox (every test
module that starts VM nodes) would upload them again each time, each blob
held in memory by kmm's pusher and digested again by the registry as it
arrives. They are made once, as OCI
image layouts in the cache (``oci.layouts``), and ``seed`` writes such an
image straight into the storage of distribution's filesystem driver, which
the registry reads on every request (no cache is configured, ``registry``):

- each blob (manifest, config, layers) at
  ``docker/registry/v2/blobs/sha256/<2 hex>/<hex>/data``, a hard link to
  the layout's file (a copy where the two are on different file systems):
  no byte is copied, nothing is uploaded, and the link keeps the data if
  the cache entry is later removed. The registry never writes a blob in
  place (an upload is renamed over a path that does not exist, and a blob
  that exists is kept), and the layout's files are read-only. Both images
  are seeded in 5 ms (0.3 s as copies);
- the repository's links: ``_layers/sha256/<hex>/link`` for the config and
  each layer, ``_manifests/revisions/sha256/<hex>/link``, and the tag's
  ``_manifests/tags/<tag>/current/link`` and ``index/sha256/<hex>/link``,
  each holding the digest, as the registry writes them when it is pushed to.

Deletes through the API then behave as for a pushed image (the links go;
a blob's removal removes the link, not the cache's file). Limits: the
storage layout is distribution's (v2 and v3 share it); one tag per seed.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kmm.oci import layouts
from kmm.oci.client import check_name, check_reference

__all__ = ["Seed", "seed", "tags"]

_ROOT: Final = Path("docker") / "registry" / "v2"


@dataclasses.dataclass(frozen=True)
class Seed:
    """The image of OCI layout ``layout``, to be served as ``name:tag``."""

    layout: Path
    name: str
    tag: str


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _write_link(path: Path, digest: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(digest)


def _link_blob(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return  # content-addressed: the same bytes
    try:
        os.link(source, target)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(source, target)


def seed(data: Path, seeds: Iterable[Seed]) -> None:
    """Write each seed's image into registry storage ``data`` (the
    filesystem driver's root directory) as ``name:tag``; ValueError when a
    layout is not a complete image or a name or tag is not one."""
    root = data / _ROOT
    for each in seeds:
        check_name(each.name)
        check_reference(each.tag)
        image = layouts.read(each.layout)
        repository = root / "repositories" / each.name
        for blob in (image.manifest, *image.blobs):
            digest = _hex(blob.digest)
            _link_blob(
                layouts.blob_path(each.layout, blob.digest),
                root / "blobs" / "sha256" / digest[:2] / digest / "data",
            )
        for blob in image.blobs:
            _write_link(repository / "_layers" / "sha256" / _hex(blob.digest) / "link", blob.digest)
        top = image.manifest.digest
        manifests = repository / "_manifests"
        _write_link(manifests / "revisions" / "sha256" / _hex(top) / "link", top)
        tag = manifests / "tags" / each.tag
        _write_link(tag / "index" / "sha256" / _hex(top) / "link", top)
        _write_link(tag / "current" / "link", top)


def tags(data: Path, name: str) -> list[str]:
    """The tags repository ``name`` has in registry storage ``data``, sorted."""
    found = data / _ROOT / "repositories" / name / "_manifests" / "tags"
    try:
        return sorted(
            path.name for path in found.iterdir() if (path / "current" / "link").is_file()
        )
    except FileNotFoundError:
        return []
