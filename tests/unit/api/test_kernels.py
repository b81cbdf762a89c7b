"""Kernel mapping and image expansion tables (DESIGN §3), plus properties."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmm.api import formats, kernels, modules, validation

_MODULE: dict[str, Any] = {
    "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
    "kind": "Module",
    "metadata": {"name": "kmod", "namespace": "drivers"},
    "spec": {
        "selector": {},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "kmod"},
                "containerImage": "r/default:${KERNEL_FULL_VERSION}",
                "inTreeModulesToRemove": ["from_container"],
                "kernelMappings": [
                    {"literal": "5.14.0-70.el9.x86_64", "containerImage": "r/literal:v1"},
                    {
                        "regexp": r"^5\.14\.",
                        "containerImage": "r/${MOD_NAMESPACE}/${MOD_NAME}:${KERNEL_XYZ}",
                        "inTreeModulesToRemove": ["from_mapping"],
                    },
                    {"regexp": "rt", "containerImage": "r/rt:$KERNEL_X.$KERNEL_Y.$KERNEL_Z"},
                    {"regexp": "^6\\."},
                ],
            }
        },
    },
}


def _module() -> modules.Module:
    return validation.parse_module(copy.deepcopy(_MODULE))


@pytest.mark.parametrize(
    ("node_kernel", "image", "in_tree"),
    [
        # Literal is exact and comes first, so it wins over the regexp below it.
        ("5.14.0-70.el9.x86_64", "r/literal:v1", ("from_container",)),
        # One trailing "+" is trimmed before matching.
        ("5.14.0-70.el9.x86_64+", "r/literal:v1", ("from_container",)),
        ("5.14.0-162.el9.x86_64", "r/drivers/kmod:5.14.0", ("from_mapping",)),
        # Regexp is an unanchored search.
        ("4.18.0-rt7", "r/rt:4.18.0", ("from_container",)),
        # Falls back to container.containerImage; "+" inside becomes "_".
        ("6.8.0-45+local+", "r/default:6.8.0-45_local", ("from_container",)),
        ("5.15.0-1.fc37", None, None),
        # Only ONE "+" is trimmed: the literal no longer matches, the regexp does.
        ("5.14.0-70.el9.x86_64++", "r/drivers/kmod:5.14.0", ("from_mapping",)),
    ],
)
def test_target(node_kernel: str, image: str | None, in_tree: tuple[str, ...] | None) -> None:
    found = kernels.target(_module(), node_kernel)
    if image is None:
        assert found is None
        return
    assert found is not None
    assert found.kernel == kernels.node_kernel(node_kernel)
    assert (found.image, found.in_tree_modules_to_remove) == (image, in_tree)


def test_no_module_loader_targets_nothing() -> None:
    obj = copy.deepcopy(_MODULE)
    del obj["spec"]["moduleLoader"]
    assert kernels.target(validation.parse_module(obj), "5.14.0-70.el9.x86_64") is None


@pytest.mark.parametrize(
    ("raw", "trimmed"),
    [("5.14.0+", "5.14.0"), ("5.14.0++", "5.14.0+"), ("5.14.0", "5.14.0"), ("+", "")],
)
def test_node_kernel_trims_one_plus(raw: str, trimmed: str) -> None:
    assert kernels.node_kernel(raw) == trimmed


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        (
            "5.14.0-70.el9.x86_64",
            {"KERNEL_XYZ": "5.14.0", "KERNEL_X": "5", "KERNEL_Y": "14", "KERNEL_Z": "0"},
        ),
        ("6.8-rc1", {"KERNEL_XYZ": "6.8.rc1", "KERNEL_X": "6", "KERNEL_Y": "8", "KERNEL_Z": "rc1"}),
        ("4,18,0", {"KERNEL_XYZ": "4.18.0", "KERNEL_X": "4", "KERNEL_Y": "18", "KERNEL_Z": "0"}),
    ],
)
def test_variables_split_on_dot_comma_dash(kernel: str, expected: dict[str, str]) -> None:
    values = kernels.variables(kernel, module_name="m", module_namespace="n")
    assert {key: values[key] for key in expected} == expected
    assert values["MOD_NAME"] == "m"
    assert values["MOD_NAMESPACE"] == "n"


@pytest.mark.parametrize("kernel", ["5.14", "6", "", "5_14_0"])
def test_fewer_than_three_parts_is_an_error(kernel: str) -> None:
    with pytest.raises(kernels.KernelMappingError, match="fewer than 3 parts"):
        kernels.variables(kernel, module_name="m", module_namespace="n")


def test_kernel_with_too_few_parts_fails_target() -> None:
    obj = copy.deepcopy(_MODULE)
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": ".", "containerImage": "r/x:${KERNEL_FULL_VERSION}"}
    ]
    with pytest.raises(kernels.KernelMappingError):
        kernels.target(validation.parse_module(obj), "6.1")


@pytest.mark.parametrize(
    ("template", "expanded"),
    [
        ("r/x:${KERNEL_FULL_VERSION}", "r/x:5.14.0-1_a"),
        ("r/x:$KERNEL_FULL_VERSION", "r/x:5.14.0-1_a"),
        ("r/$MOD_NAME:${KERNEL_X}-${KERNEL_Y}", "r/m:5-14"),
        ("r/x:plain", "r/x:plain"),
    ],
)
def test_expand(template: str, expanded: str) -> None:
    values = kernels.variables("5.14.0-1+a", module_name="m", module_namespace="n")
    assert kernels.expand(template, values) == expanded


@pytest.mark.parametrize("template", ["r/x:${NOPE}", "r/x:$NOPE", "r/x:${}"])
def test_expand_unknown_variable_is_an_error(template: str) -> None:
    values = kernels.variables("5.14.0", module_name="m", module_namespace="n")
    with pytest.raises(kernels.KernelMappingError, match="unknown variable"):
        kernels.expand(template, values)


_kernels = st.from_regex(r"\A[0-9]{1,2}[.,-][0-9]{1,3}[.,-][0-9A-Za-z_.+~-]{1,30}\Z")
_literal_text = st.text(alphabet=st.characters(codec="ascii", exclude_characters="$"), max_size=20)


@settings(deadline=None, max_examples=200)
@given(
    kernel=_kernels,
    pieces=st.lists(
        st.one_of(
            _literal_text,
            st.sampled_from(kernels.VARIABLES).map(lambda v: "${" + v + "}"),
            st.sampled_from(kernels.VARIABLES).map(lambda v: "$" + v),
        ),
        max_size=6,
    ),
)
def test_expansion_never_leaves_a_placeholder(kernel: str, pieces: list[str]) -> None:
    values = kernels.variables(kernel, module_name="m", module_namespace="n")
    # A "$VAR" directly followed by a name character would read as another
    # variable; separate pieces so each placeholder stays what it is.
    expanded = kernels.expand("/".join(pieces), values)
    assert "${" not in expanded
    assert "$" not in expanded


@settings(deadline=None, max_examples=200)
@given(kernel=_kernels)
def test_full_version_is_tag_safe(kernel: str) -> None:
    values = kernels.variables(kernel, module_name="m", module_namespace="n")
    assert all(c.isalnum() or c in "._-" for c in values["KERNEL_FULL_VERSION"])


def test_group_nodes() -> None:
    grouping = kernels.group_nodes(
        _module(),
        [
            ("n1", "5.14.0-70.el9.x86_64+"),
            ("n2", "5.14.0-162.el9.x86_64"),
            ("n3", "5.14.0-70.el9.x86_64"),
            ("n4", "5.15.0-1.fc37"),
        ],
    )
    assert grouping.nodes == {
        "5.14.0-162.el9.x86_64": ["n2"],
        "5.14.0-70.el9.x86_64": ["n1", "n3"],
    }
    assert grouping.pairs() == {
        ("5.14.0-70.el9.x86_64", "r/literal:v1"),
        ("5.14.0-162.el9.x86_64", "r/drivers/kmod:5.14.0"),
    }
    assert grouping.untargeted == ["n4"]
    assert grouping.errors == {}


def test_group_nodes_reports_kernels_that_cannot_expand() -> None:
    obj = copy.deepcopy(_MODULE)
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": ".", "containerImage": "r/x:${KERNEL_Z}"}
    ]
    grouping = kernels.group_nodes(validation.parse_module(obj), [("a", "6.1"), ("b", "6.1.0")])
    assert set(grouping.errors) == {"6.1"}
    assert grouping.nodes == {"6.1.0": ["b"]}


@settings(deadline=None, max_examples=200)
@given(
    # Tag-safe kernels whose first three parts are non-empty (an empty part,
    # as in "6.1..", empties a variable: target() refuses that image).
    kernel=st.from_regex(r"\A[0-9]{1,2}[.-][0-9]{1,3}[.-][0-9A-Za-z_][0-9A-Za-z_.-]{0,29}\Z"),
    tag=st.lists(st.sampled_from([*kernels.VARIABLES, "-", ".", "v1"]), min_size=1, max_size=4),
)
def test_expanded_images_are_valid_for_tag_safe_kernels(kernel: str, tag: list[str]) -> None:
    template = "quay.io/${MOD_NAMESPACE}/${MOD_NAME}:" + "".join(
        "${" + piece + "}" if piece in kernels.VARIABLES else piece for piece in tag
    )
    if formats.image_error(template) is not None:
        return  # e.g. a tag starting with "-" or "."; refused before expansion
    values = kernels.variables(kernel, module_name="kmod", module_namespace="drivers")
    expanded = kernels.expand(template, values)
    assert formats.image_error(expanded) is None, expanded


def test_empty_kernel_part_is_refused() -> None:
    obj = copy.deepcopy(_MODULE)
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": "^6", "containerImage": "r/x:${KERNEL_Z}"},
    ]
    with pytest.raises(kernels.KernelMappingError, match="explicit tag"):
        kernels.target(validation.parse_module(obj), "6.1..")


def test_unsafe_kernel_parts_are_refused_not_expanded_into_bad_images() -> None:
    obj = copy.deepcopy(_MODULE)
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": "^6", "containerImage": "r/x:${KERNEL_Z}"},
    ]
    module = validation.parse_module(obj)
    with pytest.raises(kernels.KernelMappingError, match=r"for kernel '6\.8\.0\+rt'"):
        kernels.target(module, "6.8.0+rt+")
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["containerImage"] = (
        "r/x:${KERNEL_FULL_VERSION}"
    )
    found = kernels.target(validation.parse_module(obj), "6.8.0+rt+")
    assert found is not None
    assert found.image == "r/x:6.8.0_rt"
