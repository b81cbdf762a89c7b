"""Image references split as Docker and containerd read them:
``[host[:port]/]name[:tag][@digest]``.

The first path component is a registry host when it has a ``.`` or a ``:``
or is ``localhost``; otherwise the image is Docker Hub's
(``registry-1.docker.io``), where a one-component name is under ``library/``.
A reference with both a tag and a digest is asked for by its digest, as
runtimes pull it. Limits: no default tag (kmm's admission requires one).
"""

from __future__ import annotations

import dataclasses

__all__ = ["DOCKER_HUB", "Reference", "parse"]

DOCKER_HUB = "registry-1.docker.io"


@dataclasses.dataclass(frozen=True)
class Reference:
    host: str  # host[:port]
    name: str  # repository
    reference: str  # tag or digest

    def __str__(self) -> str:
        separator = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.host}/{self.name}{separator}{self.reference}"


def parse(image: str) -> Reference:
    """``image`` split; ValueError when it names neither a tag nor a digest."""
    rest, at, digest = image.partition("@")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, path = first, remainder
    else:
        host, path = DOCKER_HUB, rest
        if "/" not in path:
            path = f"library/{path}"
    name, colon, tag = path.rpartition(":")
    if not colon:
        name, tag = path, ""
    if at:
        return Reference(host, name, digest)
    if not tag:
        raise ValueError(f"image {image!r} names no tag and no digest")
    return Reference(host, name, tag)
