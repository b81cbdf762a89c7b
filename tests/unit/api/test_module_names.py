"""Kernel module names (``moduleName``, ``modulesLoadingOrder``) are one word:
the loader writes the order into a modprobe.d file, where whitespace would
split a line or start another."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.api import crd, regexps, validation

_MODPROBE = "spec.moduleLoader.container.modprobe"


def _modprobe(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = obj["spec"]["moduleLoader"]["container"]["modprobe"]
    return found


@pytest.mark.parametrize(
    ("order", "path"),
    [
        (["my kmod", "my_dep_a"], f"{_MODPROBE}.moduleName"),
        (
            ["my-kmod", "my_dep_a\ninstall my_dep_a /bin/true"],
            f"{_MODPROBE}.modulesLoadingOrder[1]",
        ),
        (["my-kmod", "my_dep_a\t"], f"{_MODPROBE}.modulesLoadingOrder[1]"),
        (["my-kmod", "a\vb"], f"{_MODPROBE}.modulesLoadingOrder[1]"),
    ],
)
def test_whitespace_in_a_module_name_is_refused(
    upstream_style: dict[str, Any], order: list[str], path: str
) -> None:
    modprobe = _modprobe(upstream_style)
    modprobe["moduleName"] = order[0]
    modprobe["modulesLoadingOrder"] = order
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(upstream_style)
    found = [(v.path, v.message) for v in caught.value.violations]
    assert any(p == path and "no whitespace" in m for p, m in found), found


@pytest.mark.parametrize("name", ["my-kmod", "my_kmod", "snd-hda-intel", "pci:v00008086d*"])
def test_module_names_modprobe_takes_are_accepted(
    upstream_style: dict[str, Any], name: str
) -> None:
    modprobe = _modprobe(upstream_style)
    modprobe["moduleName"] = name
    modprobe["modulesLoadingOrder"] = [name, "my_dep_a"]
    module = validation.parse_module(upstream_style)
    assert module.spec.module_loader is not None
    assert module.spec.module_loader.container.modprobe.modules_loading_order == [name, "my_dep_a"]


def test_the_crd_rule_is_re2_and_on_both_fields() -> None:
    schema = crd.render()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    modprobe = schema["properties"]["spec"]["properties"]["moduleLoader"]["properties"][
        "container"
    ]["properties"]["modprobe"]["properties"]
    for field in (modprobe["moduleName"], modprobe["modulesLoadingOrder"]["items"]):
        (rule,) = [r for r in field["x-kubernetes-validations"] if "whitespace" in r["message"]]
        pattern = rule["rule"].removeprefix("!self.matches('").removesuffix("')")
        assert regexps.error(pattern.replace("\\\\", "\\")) is None
