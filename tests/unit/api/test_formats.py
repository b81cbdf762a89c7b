"""Format checks: images, DNS names, label values (regexps: ``test_regexps``)."""

from __future__ import annotations

import re

import pytest

from kmm.api import formats, regexps


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
    ("image", "error"),
    [
        ("r/plugin:1", None),
        ("host:5000/org/plugin@sha256:" + "0" * 64, None),
        ("r/plugin", "explicit tag"),
        ("r/$MOD_NAME:1", "may not use variables"),
        ("r/plugin:${KERNEL_FULL_VERSION}", "may not use variables"),
        ("r/plugin:${UNKNOWN}", "may not use variables"),
        ("r/plugin:{1}", "may not use variables"),
    ],
)
def test_plain_images_take_no_variables(image: str, error: str | None) -> None:
    found = formats.plain_image_error(image)
    assert found is None if error is None else error in (found or ""), found


def test_cel_patterns_are_the_python_patterns() -> None:
    # The CRD uses these verbatim; they must stay RE2-compatible themselves.
    for pattern in (
        formats.IMAGE_PATTERN,
        formats.VARIABLE_CHARACTERS_PATTERN,
        formats.DNS_SUBDOMAIN_PATTERN,
        formats.LABEL_VALUE_PATTERN,
    ):
        re.compile(pattern)
        assert regexps.error(pattern) is None


@pytest.mark.parametrize(
    ("name", "ok"),
    [("gpu.example.com", True), ("a", True), ("A.b", False), ("a_b", False), ("a" * 254, False)],
)
def test_dns_subdomain(name: str, ok: bool) -> None:
    assert (formats.dns_subdomain_error(name) is None) is ok
