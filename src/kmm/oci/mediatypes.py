"""Manifest media types, OCI's and Docker's, and what a client accepts."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACCEPT",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "INDEXES",
    "MANIFESTS",
    "OCI_INDEX",
    "OCI_MANIFEST",
]

OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS: Final = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES: Final = (OCI_INDEX, DOCKER_LIST)
# Without an Accept naming it, a registry may convert a manifest or answer 404
# for a type the client did not list.
ACCEPT: Final = ", ".join((*MANIFESTS, *INDEXES))
