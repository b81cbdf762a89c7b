"""Format checks shared by the models, the kernel mapper and the CRD rendering.

Each check has a Python form (returning an error text or ``None``) and, where
CEL can express it, the RE2 pattern the CRD uses, so both judge alike.

The fixed patterns here are ours and have no nested quantifiers, so Python's
``re`` runs them in time linear in the input; user-written kernel-mapping
regexps go to RE2 (:mod:`kmm.api.regexps`).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DNS_SUBDOMAIN_PATTERN",
    "IMAGE_PATTERN",
    "IMAGE_VARIABLES",
    "LABEL_VALUE_PATTERN",
    "PLACEHOLDER",
    "VARIABLE_CHARACTERS_PATTERN",
    "dns_subdomain_error",
    "image_error",
    "label_value_error",
    "plain_image_error",
]

# Name, then a tag (placeholders like ${KERNEL_FULL_VERSION} allowed) and/or a
# digest. The character before ":" may not be "/" or ":", so "host:5000/repo"
# does not pass for a tagged image. RE2-compatible: the CRD uses it verbatim.
_DIGEST: Final = r"@[A-Za-z0-9_+.-]+:[A-Fa-f0-9]{32,}"
IMAGE_PATTERN: Final = r"^[^\s@]*[^\s@/:](:[A-Za-z0-9_.${}-]+(" + _DIGEST + r")?|" + _DIGEST + r")$"
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

# Variables an image may name (expanded by kmm.api.kernels, DESIGN §3).
IMAGE_VARIABLES: Final = (
    "KERNEL_FULL_VERSION",
    "KERNEL_XYZ",
    "KERNEL_X",
    "KERNEL_Y",
    "KERNEL_Z",
    "MOD_NAME",
    "MOD_NAMESPACE",
)
PLACEHOLDER: Final = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# What only a placeholder puts in an image: no image reference has these.
VARIABLE_CHARACTERS_PATTERN: Final = r"[${}]"

_IMAGE = re.compile(IMAGE_PATTERN)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def image_error(image: str) -> str | None:
    """Why ``image`` is not an image reference with an explicit tag or digest."""
    if not _IMAGE.match(image):
        return f"image {image!r} must name an explicit tag (name:tag) or digest (name@sha256:...)"
    for match in PLACEHOLDER.finditer(image):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if name not in IMAGE_VARIABLES:
            return f"image {image!r} names unknown variable {name!r}; known: {', '.join(IMAGE_VARIABLES)}"
    return None


def plain_image_error(image: str) -> str | None:
    """Why ``image`` is not an image reference taken as written (no variables).

    KMM expands variables only in kernel-mapping images (and ``sign``); a
    device-plugin or DRA image goes to the pod verbatim, so ``$MOD_NAME`` there
    would name an image no runtime can pull.
    """
    if re.search(VARIABLE_CHARACTERS_PATTERN, image):
        return (
            f"image {image!r} may not use variables ({', '.join(IMAGE_VARIABLES)}): "
            "they are expanded only in moduleLoader images"
        )
    return image_error(image)


def dns_subdomain_error(name: str) -> str | None:
    """Why ``name`` is not a DNS subdomain (RFC 1123, at most 253 characters)."""
    if len(name) <= 253 and _DNS_SUBDOMAIN.match(name):
        return None
    return f"{name!r} must be a DNS subdomain: lowercase alphanumerics, '-' and '.', at most 253 characters"


def label_value_error(value: str) -> str | None:
    """Why ``value`` cannot be a label value."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return None
    return (
        f"{value!r} must be a valid label value: at most 63 characters of "
        "[A-Za-z0-9._-], starting and ending with an alphanumeric"
    )
