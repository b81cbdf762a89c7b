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
    "IMAGE_NAME_LENGTH_MESSAGE",
    "IMAGE_NAME_PREFIX_PATTERN",
    "IMAGE_PATTERN",
    "IMAGE_REFERENCE_MESSAGE",
    "IMAGE_REFERENCE_PATTERN",
    "IMAGE_VARIABLES",
    "LABEL_VALUE_PATTERN",
    "MAX_IMAGE_NAME",
    "PLACEHOLDER",
    "PLACEHOLDER_VALUE",
    "VARIABLE_CHARACTERS_PATTERN",
    "WHITESPACE_PATTERN",
    "cel_substituted",
    "dns_subdomain_error",
    "image_error",
    "label_value_error",
    "plain_image_error",
    "substituted",
]

# Name, then a tag (placeholders like ${KERNEL_FULL_VERSION} allowed) and/or a
# digest. The character before ":" may not be "/" or ":", so "host:5000/repo"
# does not pass for a tagged image. RE2-compatible: the CRD uses it verbatim.
_DIGEST: Final = r"@[A-Za-z0-9_+.-]+:[A-Fa-f0-9]{32,}"
IMAGE_PATTERN: Final = r"^[^\s@]*[^\s@/:](:[A-Za-z0-9_.${}-]+(" + _DIGEST + r")?|" + _DIGEST + r")$"

# The reference grammar of distribution/reference (what containerd and the
# kubelet parse), RE2-compatible: [domain/]path[:tag][@digest]. kmm reads the
# first path component as a registry host only when it has a '.' or a ':'
# port, or is 'localhost' (Docker also takes one with upper-case letters
# for a host; kmm refuses that name instead: "MyOrg/driver" is almost
# always a mistyped Docker Hub repository, never a host worth dialling).
_DOMAIN_COMPONENT: Final = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN: Final = (
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})+(?::[0-9]+)?"
    rf"|{_DOMAIN_COMPONENT}:[0-9]+|localhost|\[[a-fA-F0-9:]+\](?::[0-9]+)?)"
)
_PATH_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG: Final = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_REFERENCE_DIGEST: Final = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_PATTERN: Final = (
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    rf"(?::{_TAG})?(?:@{_REFERENCE_DIGEST})?$"
)
IMAGE_REFERENCE_MESSAGE: Final = (
    "must be an image reference [host[:port]/]path[:tag][@digest]: path components of "
    "lower-case letters and digits joined by '.', '_', '__' or '-' (a first component "
    "is a host only with a '.', a ':port', or as 'localhost'), a tag of at most 128 of "
    "[A-Za-z0-9_.-] not starting with '.' or '-'"
)
# The name (host and path) of a reference that matched the grammar.
IMAGE_NAME_PREFIX_PATTERN: Final = r"^(?:[^/@]*/)?[^:@]*"
MAX_IMAGE_NAME: Final = 255  # distribution's NameTotalLengthMax
IMAGE_NAME_LENGTH_MESSAGE: Final = (
    f"must name an image (host and path) of at most {MAX_IMAGE_NAME} characters"
)
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Whitespace as one explicit class: RE2's \s and Python's differ (Python's
# takes \v and Unicode spaces), and a rule must judge alike in both.
WHITESPACE_PATTERN: Final = r"[ \t\n\v\f\r]"

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
# What a variable is taken for when the literal parts of an image are
# checked: a value the grammar allows in every position (host, port, path,
# tag, digest), so that what the literal text breaks is told at admission
# and only what expansion reveals is left to each kernel.
PLACEHOLDER_VALUE: Final = "0"
# What only a placeholder puts in an image: no image reference has these.
VARIABLE_CHARACTERS_PATTERN: Final = r"[${}]"

_IMAGE = re.compile(IMAGE_PATTERN)
_IMAGE_REFERENCE = re.compile(IMAGE_REFERENCE_PATTERN)
_IMAGE_NAME_PREFIX = re.compile(IMAGE_NAME_PREFIX_PATTERN)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def substituted(image: str) -> str:
    """``image`` with every variable replaced by ``PLACEHOLDER_VALUE``."""
    return PLACEHOLDER.sub(PLACEHOLDER_VALUE, image)


def cel_substituted(expression: str) -> str:
    """CEL for ``substituted(<expression>)``, given that every variable in it
    is a known one (the rule beside it): both spellings of each replaced,
    longest first, so ``$KERNEL_XYZ`` is not read as ``$KERNEL_X`` + "YZ"."""
    spellings = sorted(
        [f"${{{v}}}" for v in IMAGE_VARIABLES] + [f"${v}" for v in IMAGE_VARIABLES],
        key=lambda found: (-len(found), found),
    )
    for spelling in spellings:
        expression += f".replace({spelling!r}, {PLACEHOLDER_VALUE!r})"
    return expression


def image_error(image: str) -> str | None:
    """Why ``image`` is not an image reference with an explicit tag or
    digest; its variables taken for any value the grammar allows (an
    expanded image has none, and is judged whole)."""
    if not _IMAGE.match(image):
        return f"image {image!r} must name an explicit tag (name:tag) or digest (name@sha256:...)"
    for match in PLACEHOLDER.finditer(image):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if name not in IMAGE_VARIABLES:
            return f"image {image!r} names unknown variable {name!r}; known: {', '.join(IMAGE_VARIABLES)}"
    literal = substituted(image)
    if not _IMAGE_REFERENCE.match(literal):
        return f"image {image!r} {IMAGE_REFERENCE_MESSAGE}"
    name = _IMAGE_NAME_PREFIX.match(literal)
    if name is not None and len(name.group(0)) > MAX_IMAGE_NAME:
        return f"image {image!r} {IMAGE_NAME_LENGTH_MESSAGE}"
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
