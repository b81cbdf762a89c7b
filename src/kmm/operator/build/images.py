"""The images of one kernel that builds or signs, and what is known of them (pure).

A kernel's *final* image is ``kernels.Target.image``: what its loader runs.
With ``sign`` there is also an *unsigned* image, the one a sign pod signs:

- build and sign: the build's ``intermediate_image(final)``
  (``<repo>:<tag>-kmm-unsigned``), which only kmm pushes, so that only a
  signed image ever carries the final name;
- sign without build: ``sign.unsignedImage``, which someone else pushes
  (``foreign_unsigned``), asked with ``unsignedImageRegistryTLS``.

``Facts`` is what the registry said of both (``existence``), ``keys`` how
they are asked, so the build concern and the preflight reconciler share
one checker's answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Final

from kmm.api import buildsign, kernels, modules
from kmm.operator.build import existence

__all__ = [
    "Facts",
    "foreign_unsigned",
    "intermediate_image",
    "keys",
    "pushed_by",
    "unsigned_image",
    "unsigned_wanted",
]

# Docker's limit on a tag's length.
_MAX_TAG: Final = 128
_UNSIGNED_SUFFIX: Final = "-kmm-unsigned"


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the registry said of one kernel's final image and, while it is
    missing and the kernel signs, of its unsigned image (None: not asked)."""

    final: existence.Fact
    unsigned: existence.Fact | None = None


def intermediate_image(final: str) -> str:
    """Where a build that a sign follows pushes: ``<repo>:<tag>-kmm-unsigned``.

    Only the sign pod pushes under the final name, so a loader never runs an
    unsigned image. A tag that would exceed 128 characters is cut and ends
    in a digest of the whole tag. ``final`` must carry a tag, not a digest
    (admission refuses a digest beside ``build``).
    """
    repository, tag = _split_tag(final)
    new_tag = tag + _UNSIGNED_SUFFIX
    if len(new_tag) > _MAX_TAG:
        digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
        new_tag = f"{tag[: _MAX_TAG - len(_UNSIGNED_SUFFIX) - len(digest) - 1]}-{digest}"
        new_tag += _UNSIGNED_SUFFIX
    return f"{repository}:{new_tag}"


def _split_tag(image: str) -> tuple[str, str]:
    if "@" in image:
        raise ValueError(f"image {image!r} names a digest; a build pushes to a tag")
    repository, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        raise ValueError(f"image {image!r} has no tag")
    return repository, tag


def foreign_unsigned(target: kernels.Target) -> str | None:
    """``sign.unsignedImage`` of a kernel that signs without building: an
    image someone else pushes. None when the kernel builds, or does not sign."""
    sign = target.sign
    if target.build is not None or sign is None:
        return None
    return sign.unsigned_image


def unsigned_image(target: kernels.Target) -> str:
    """The image a sign pod of ``target`` signs (``target`` signs)."""
    return foreign_unsigned(target) or intermediate_image(target.image)


def _unsigned_tls(target: kernels.Target) -> buildsign.RegistryTLS | None:
    if foreign_unsigned(target) is not None and target.sign is not None:
        return target.sign.unsigned_image_registry_tls
    return target.registry_tls


def pushed_by(target: kernels.Target, role: str) -> str:
    """The image a pod of ``role`` (``build``/``sign``) pushes for ``target``:
    the final one, but a build that a sign follows pushes the intermediate one."""
    if role == "build" and target.sign is not None:
        return intermediate_image(target.image)
    return target.image


def keys(module: modules.Module, target: kernels.Target) -> tuple[existence.Key, existence.Key]:
    """The existence keys of the final and the unsigned image, with the
    Module's ``imageRepoSecret`` (``kmm.operator.preflight`` asks with the
    same keys, so both share the checker's facts)."""
    secret = module.spec.image_repo_secret
    namespace = module.metadata.namespace or ""
    who = f"{namespace}/{secret.name}" if secret is not None else ""
    final = existence.Key(target.image, existence.Tls.of(target.registry_tls), who)
    if target.sign is None:
        unsigned = existence.Key(intermediate_image(target.image), final.tls, who)
        return final, unsigned
    tls = existence.Tls.of(_unsigned_tls(target))
    return final, existence.Key(unsigned_image(target), tls, who)


def unsigned_wanted(target: kernels.Target, final: existence.Fact) -> bool:
    """Whether the unsigned image's existence matters to the build concern:
    the kernel signs and its final image is missing."""
    return target.sign is not None and final.state is existence.State.MISSING
