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

What made an image: every image a build or sign pod pushes carries, in its
config, the labels ``kmm.api.labels.IMAGE_LABELS``: the hash of the build's
inputs and the rebuild trigger it ran for (the build sets them), whether it
was signed, with which certificate (sha256 of its DER form) and the hash of
the sign's inputs (the sign sets them, keeping the build's). ``Wanted`` is
the same for what the Module asks for now (``desired.wanted``);
``outdated`` compares them and says why an image is not what the Module
asks for (it is then built and signed again from the current inputs),
``signable`` whether an intermediate image may be signed. An image without
those labels (one kmm did not build, or an older kmm) is taken as it is,
as KMM takes every image; so is one whose labels cannot be read (an index,
or a node's verdict, ``pulling``).

What the hashes cover (``hashing.image_build_hash``/``image_sign_hash``):
the Dockerfile's text, the build arguments (the kernel among them) and the
build secrets' resourceVersions; the sign's source (the build's hash, or
``unsignedImage``), ``filesToSign`` and ``dirName``; the certificate by its
fingerprint, so a Secret made again with the same certificate signs
nothing again. Not covered, unlike a pod's ``last-hash``: how the pod is
rendered (the builder image, tolerations, the registry CA: an operator
upgrade rebuilds nothing) and the ``imageRepoSecret`` (rotating a pull
password rebuilds nothing). ``imageRebuildTriggerGeneration`` is a label
of its own, compared for the intermediate image only: moving it asks
every image again (KMM's "verify, rebuild if missing") and never signs an
intermediate image an earlier pass left, but rebuilds no final image that
exists and matches.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Final

from kmm.api import buildsign, kernels, labels, modules
from kmm.operator.build import existence

__all__ = [
    "Facts",
    "Wanted",
    "foreign_unsigned",
    "intermediate_image",
    "keys",
    "made_by_kmm",
    "outdated",
    "pushed_by",
    "signable",
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


def unsigned_wanted(
    target: kernels.Target, final: existence.Fact, *, outdated: bool = False
) -> bool:
    """Whether the unsigned image's existence matters to the build concern:
    the kernel signs and its final image is missing (or ``outdated``)."""
    return target.sign is not None and (final.state is existence.State.MISSING or outdated)


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What a kernel's image is to be made of now: the build's hash (None:
    the kernel does not build), the rebuild trigger ("" when unset), the
    sign's hash and the certificate's fingerprint (None: it does not sign,
    or its certificate cannot be read)."""

    build: str | None = None
    trigger: str = ""
    sign: str | None = None
    cert: str | None = None


def made_by_kmm(found: Mapping[str, str] | None) -> bool:
    """Whether labels read of an image say kmm made it (one of its labels set)."""
    return any(found.get(key) for key in labels.IMAGE_LABELS) if found else False


def outdated(target: kernels.Target, fact: existence.Fact, wanted: Wanted) -> list[str]:
    """Why the existing image ``fact`` is not what ``target`` asks for, in
    words; [] when it is, or when kmm did not make it (taken as it is)."""
    found = fact.labels
    if fact.state is not existence.State.EXISTS or found is None or not made_by_kmm(found):
        return []
    why: list[str] = []
    if target.build is not None and found.get(labels.IMAGE_BUILD_HASH) != wanted.build:
        why.append("it was built from other inputs")
    signed = found.get(labels.IMAGE_SIGNED) == "true"
    if target.sign is None:
        if signed:
            why.append("it is signed and the Module no longer signs")
    elif not signed:
        why.append("it is not signed")
    elif wanted.cert is not None and found.get(labels.IMAGE_SIGNING_CERT) != wanted.cert:
        why.append("it was signed with another certificate")
    elif found.get(labels.IMAGE_SIGN_HASH) != wanted.sign:
        why.append("it was signed from other inputs")
    return why


def signable(target: kernels.Target, fact: existence.Fact, wanted: Wanted) -> bool | None:
    """Whether the existing unsigned image ``fact`` may be signed for
    ``target``: someone else's ``unsignedImage`` always (taken as it is);
    the build's intermediate image only when its labels say this build made
    it, for this rebuild trigger. None when its labels are not known (a
    node's verdict): the sign pod checks them itself (``scripts.SIGN``)."""
    if target.build is None:
        return True
    found = fact.labels
    if found is None:
        return None
    return (
        bool(wanted.build)
        and found.get(labels.IMAGE_BUILD_HASH) == wanted.build
        and found.get(labels.IMAGE_REBUILD_TRIGGER, "") == wanted.trigger
    )
