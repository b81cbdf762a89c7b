"""Read an OCI archive: the tar ``buildah commit ... oci-archive:`` (and
``make image``) writes, holding an OCI image layout (``oci-layout``,
``index.json``, ``blobs/sha256/<hex>``).

``Archive`` reads the tar's member list once and each blob on demand, checking
its digest. Limits: sha256 blobs only; the tar is read from a file (not a
stream); an image index nested in ``index.json`` is followed one level per call.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from types import TracebackType
from typing import Any

from kmm.oci import mediatypes
from kmm.oci.descriptors import Descriptor, check_digest, sha256_digest

__all__ = ["REF_NAME", "Archive", "NotAnArchive"]

# The annotation naming an image in an OCI layout's index.
REF_NAME = "org.opencontainers.image.ref.name"


class NotAnArchive(ValueError):
    """The file is not an OCI archive, or a blob in it is missing or corrupt."""


def _normal(member: str) -> str:
    return member[2:] if member.startswith("./") else member


class Archive:
    """An open OCI archive; use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._tar = tarfile.open(path, "r:*")  # noqa: SIM115 - closed by close()
        except (OSError, tarfile.TarError) as err:
            raise NotAnArchive(f"{path} is not a readable tar archive: {err}") from err
        self._members = {
            _normal(member.name): member for member in self._tar.getmembers() if member.isfile()
        }
        try:
            layout = json.loads(self._read("oci-layout", "the OCI layout marker"))
            if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
                raise NotAnArchive(f"{path}: oci-layout has no imageLayoutVersion")
            index = json.loads(self._read("index.json", "the image index"))
        except ValueError as err:
            self.close()
            if isinstance(err, NotAnArchive):
                raise
            raise NotAnArchive(f"{path}: {err}") from err
        self.index: dict[str, Any] = index if isinstance(index, dict) else {}
        try:
            self.manifests = [
                Descriptor.parse(entry, f"index.json manifests[{i}]")
                for i, entry in enumerate(self.index.get("manifests") or ())
            ]
        except ValueError as err:
            self.close()
            raise NotAnArchive(f"{path}: {err}") from err
        if not self.manifests:
            self.close()
            raise NotAnArchive(f"{path}: index.json lists no manifest")

    def __enter__(self) -> Archive:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._tar.close()

    def _read(self, member: str, what: str) -> bytes:
        found = self._members.get(member)
        if found is None:
            raise NotAnArchive(f"{self.path} is not an OCI archive: it has no {member} ({what})")
        stream = self._tar.extractfile(found)
        assert stream is not None  # a regular file
        with stream:
            return stream.read()

    def has_blob(self, digest: str) -> bool:
        return f"blobs/sha256/{check_digest(digest).removeprefix('sha256:')}" in self._members

    def blob(self, descriptor: Descriptor) -> bytes:
        """The blob's bytes, checked against the descriptor's digest and size."""
        member = f"blobs/sha256/{check_digest(descriptor.digest).removeprefix('sha256:')}"
        data = self._read(member, f"blob {descriptor.digest}")
        if sha256_digest(data) != descriptor.digest or len(data) != descriptor.size:
            raise NotAnArchive(
                f"{self.path}: blob {descriptor.digest} is corrupt "
                f"({len(data)} bytes with digest {sha256_digest(data)}, "
                f"expected {descriptor.size})"
            )
        return data

    def manifest(self, descriptor: Descriptor) -> dict[str, Any]:
        """The parsed manifest or index the descriptor points at."""
        try:
            document = json.loads(self.blob(descriptor))
        except ValueError as err:
            if isinstance(err, NotAnArchive):
                raise
            raise NotAnArchive(f"{self.path}: {descriptor.digest} is not JSON: {err}") from err
        if not isinstance(document, dict):
            raise NotAnArchive(f"{self.path}: {descriptor.digest} is not a JSON object")
        return document

    def children(self, descriptor: Descriptor) -> list[Descriptor]:
        """What a manifest or index refers to: config and layers, or manifests."""
        document = self.manifest(descriptor)
        if descriptor.media_type in mediatypes.INDEXES:
            entries = document.get("manifests") or []
            return [
                Descriptor.parse(entry, f"{descriptor.digest} manifests[{i}]")
                for i, entry in enumerate(entries)
            ]
        if descriptor.media_type not in mediatypes.MANIFESTS:
            raise NotAnArchive(
                f"{self.path}: {descriptor.digest} has media type {descriptor.media_type!r}, "
                "neither a manifest nor an index"
            )
        try:
            config = Descriptor.parse(document["config"], f"{descriptor.digest} config")
        except KeyError as err:
            raise NotAnArchive(f"{self.path}: manifest {descriptor.digest} has no config") from err
        layers = [
            Descriptor.parse(entry, f"{descriptor.digest} layers[{i}]")
            for i, entry in enumerate(document.get("layers") or [])
        ]
        return [config, *layers]
