"""What an image says of itself: its manifest's digest and its config's labels.

``inspect`` reads one image: a manifest GET (not a HEAD: the body names
the config blob) and, for a single-platform image manifest, a GET of its
config blob, whose ``config.Labels`` are the labels a build gave it
(``buildah build --label``, a Dockerfile's ``LABEL``). Both requests go
through the caller's ``client.Client``, so its guards and its limits on
what it reads hold (``destinations``; ``max_body``).

An index (a multi-platform image) has no config of its own: it is
reported with its digest and no labels (``labels`` None), as is a
manifest whose config cannot be read as JSON: "not known", which a caller
must tell from "known to have none" (``{}``).

Limits: only the labels whose keys start with ``keep`` are kept (the
caller's own: the rest is someone else's, and memory); no platform is
chosen inside an index.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from kmm.oci import client, errors, mediatypes

__all__ = ["Inspected", "inspect"]


@dataclasses.dataclass(frozen=True)
class Inspected:
    """An image that exists: its manifest's digest and media type, and its
    config's labels (those kept), or None when they could not be read."""

    digest: str
    media_type: str
    labels: Mapping[str, str] | None


def _config_digest(manifest: bytes) -> str | None:
    try:
        found = json.loads(manifest)["config"]["digest"]
    except (ValueError, KeyError, TypeError):
        return None
    return found if isinstance(found, str) else None


def _labels(config: bytes, keep: str) -> dict[str, str] | None:
    try:
        document = json.loads(config)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    found = (document.get("config") or {}).get("Labels") or {}
    if not isinstance(found, dict):
        return None
    return {str(k): str(v) for k, v in found.items() if str(k).startswith(keep)}


async def inspect(
    registry: client.Client, name: str, reference: str, *, keep: str
) -> Inspected | None:
    """The image ``name:reference`` (or ``@digest``), or None when it is
    missing (404, or a granted token refused: ``client.Client.exists``).
    Authentication errors and everything else raise (``errors``)."""
    try:
        descriptor, body = await registry.get_manifest(name, reference)
    except (errors.NotFound, errors.ScopeDenied):
        return None
    media_type = descriptor.media_type
    if media_type not in mediatypes.MANIFESTS:
        media_type = str(_media_type(body) or media_type)
    config = _config_digest(body) if media_type in mediatypes.MANIFESTS else None
    if config is None:
        return Inspected(descriptor.digest, media_type, None)
    try:
        blob = await registry.get_blob(name, config)
    except ValueError:
        return Inspected(descriptor.digest, media_type, None)  # not a sha256 digest
    return Inspected(descriptor.digest, media_type, _labels(blob, keep))


def _media_type(body: bytes) -> str | None:
    """The ``mediaType`` a manifest names itself (a registry may answer
    with a generic Content-Type)."""
    try:
        found = json.loads(body).get("mediaType")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None
