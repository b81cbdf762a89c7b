"""Format checks: images, DNS names, and the RE2 approximation."""

from __future__ import annotations

import re

import pytest

from kmm.api import formats


@pytest.mark.parametrize(
    "image",
    [
        "r/x:1",
        "quay.io/org/x:v1.2.3",
        "host:5000/org/x:latest",
        "x@sha256:" + "0" * 64,
        "host:5000/x:tag@sha256:" + "f" * 64,
        "quay.io/org/x:${KERNEL_FULL_VERSION}",
        "quay.io/${MOD_NAMESPACE}/${MOD_NAME}:$KERNEL_XYZ-build",
    ],
)
def test_images_with_tag_or_digest(image: str) -> None:
    assert formats.image_error(image) is None


@pytest.mark.parametrize(
    "image",
    [
        "x",
        "quay.io/org/x",
        "host:5000/org/x",
        "x:",
        "x@sha256:short",
        "x:tag with space",
        "r/x:${UNKNOWN}",
    ],
)
def test_images_without_tag_or_digest(image: str) -> None:
    assert formats.image_error(image) is not None


@pytest.mark.parametrize(
    ("pattern", "error"),
    [
        (r"^5\.14\..*$", None),
        (r"^.+\.el9(_\d+)?\.x86_64$", None),
        (r"[(?=]", None),  # inside a class these are plain characters
        (r"[]a](?:x)", None),
        (r"\\1", None),  # an escaped backslash, then "1"
        ("(", "does not compile"),
        (r"(?=a)", "lookahead"),
        (r"(?!a)", "negative lookahead"),
        (r"(?<=a)b", "lookbehind"),
        (r"(?<!a)b", "negative lookbehind"),
        (r"(a)\1", "backreference"),
        (r"(?P<x>a)(?P=x)", "named backreference"),
        (r"a*+", "possessive"),
        (r"(?>a)", "atomic group"),
        (r"(a)?(?(1)b|c)", "conditional"),
        (r"a\Z", r"\Z"),
        (r"(?i)^5\.14", None),
        (r"(?s:a.b)", None),
        (r"(?x) a b", "flag group"),
        (r"(?a:\w)", "flag group"),
    ],
)
def test_regexp_error(pattern: str, error: str | None) -> None:
    found = formats.regexp_error(pattern)
    if error is None:
        assert found is None
    else:
        assert found is not None
        assert error in found


def test_cel_patterns_are_the_python_patterns() -> None:
    # The CRD uses these verbatim; they must stay RE2-compatible themselves.
    for pattern in (
        formats.IMAGE_PATTERN,
        formats.DNS_SUBDOMAIN_PATTERN,
        formats.LABEL_VALUE_PATTERN,
    ):
        re.compile(pattern)
        assert formats.regexp_error(pattern) is None


@pytest.mark.parametrize(
    ("name", "ok"),
    [("gpu.example.com", True), ("a", True), ("A.b", False), ("a_b", False), ("a" * 254, False)],
)
def test_dns_subdomain(name: str, ok: bool) -> None:
    assert (formats.dns_subdomain_error(name) is None) is ok
