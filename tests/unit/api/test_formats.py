"""Format checks: images, DNS names, label values (regexps: ``test_regexps``)."""

from __future__ import annotations

import re

import image_cases
import pytest

from kmm.api import examples, formats, kernels, regexps, validation


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
        formats.IMAGE_REFERENCE_PATTERN,
        formats.IMAGE_NAME_PREFIX_PATTERN,
    ):
        re.compile(pattern)
        assert regexps.error(pattern) is None


@pytest.mark.parametrize(
    ("name", "ok"),
    [("gpu.example.com", True), ("a", True), ("A.b", False), ("a_b", False), ("a" * 254, False)],
)
def test_dns_subdomain(name: str, ok: bool) -> None:
    assert (formats.dns_subdomain_error(name) is None) is ok


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in image_cases.CASES])
def test_image_names_as_the_api_server_judges_them(case: image_cases.Case) -> None:
    """The Python half of each image rule (tests/integration/test_module_admission.py
    runs the CEL half with the same cases)."""
    obj = examples.module()
    path = image_cases.place(case, obj)
    if case.message is None:
        validation.parse_module(obj)
        return
    with pytest.raises(validation.InvalidModuleError) as refused:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in refused.value.violations]
    wanted = case.python or case.message
    assert any(p == path and wanted in m for p, m in found), found


@pytest.mark.parametrize(
    ("template", "kernel", "error"),
    [
        # Nine times the kernel is a tag of 152 characters: only expansion tells.
        ("r.io/m:" + "${KERNEL_FULL_VERSION}" * 9, "6.8.0-45-generic", "image reference"),
        # KERNEL_Z of "6.1.0+rt-1" is "0+rt": no '+' in a path.
        ("r.io/m-${KERNEL_Z}/x:v1", "6.1.0+rt-1", "image reference"),
        ("r.io/m-${KERNEL_Z}/x:v1", "6.8.0-45-generic", None),
    ],
)
def test_what_only_expansion_reveals_is_the_kernels_error(
    template: str, kernel: str, error: str | None
) -> None:
    obj = examples.module()
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": "^.+$", "containerImage": template}
    ]
    module = validation.parse_module(obj)  # admitted: the literal parts are fine
    if error is None:
        assert kernels.target(module, kernel) is not None
        return
    with pytest.raises(kernels.KernelMappingError, match=error) as failed:
        kernels.target(module, kernel)
    assert kernel in str(failed.value)


def test_a_kernel_that_expands_a_built_image_to_a_digest_is_the_kernels_error() -> None:
    obj = examples.module()
    container = obj["spec"]["moduleLoader"]["container"]
    container["kernelMappings"] = [{"regexp": "^.+$", "containerImage": "r.io/m:v1${KERNEL_X}"}]
    container["build"] = {"dockerfileConfigMap": {"name": "dockerfile"}}
    module = validation.parse_module(obj)
    kernel = "@sha256:" + "a" * 64 + ".1.2"  # a node's kernelVersion is the node's to say
    with pytest.raises(kernels.KernelMappingError, match="names a digest"):
        kernels.target(module, kernel)
