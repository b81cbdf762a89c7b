"""A content descriptor: media type, digest, size (the OCI image spec's)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["Descriptor", "check_digest", "sha256_digest"]

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    """``digest`` if it is a sha256 digest; ValueError otherwise (a digest
    becomes a file name and a URL path: nothing else may pass)."""
    if not _DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a sha256 digest (sha256:<64 hex digits>)")
    return digest


def sha256_digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@dataclasses.dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, document: Any, where: str) -> Descriptor:
        """A descriptor from its JSON form; ValueError naming ``where``."""
        if not isinstance(document, Mapping):
            raise ValueError(f"{where} is not a descriptor object")
        try:
            media_type = str(document["mediaType"])
            digest = check_digest(str(document["digest"]))
            size = int(document["size"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where} is not a valid descriptor: {err}") from err
        annotations = document.get("annotations") or {}
        return cls(media_type, digest, size, {str(k): str(v) for k, v in annotations.items()})
