"""Admission of build and sign by the operator's validation (the Python half
of each rule; tests/integration/test_module_admission.py runs the CEL half
on the API server with the same cases)."""

from __future__ import annotations

import copy

import build_sign_cases as cases
import pytest

from kmm.api import modules, validation

Obj = cases.Obj


def _dump(module: modules.Module) -> Obj:
    return module.model_dump(mode="json", exclude_unset=True)


def test_building_and_signing_module_is_accepted_unchanged(build_sign: Obj) -> None:
    module = validation.parse_module(copy.deepcopy(build_sign))
    assert _dump(module) == build_sign
    assert module.spec.image_rebuild_trigger_generation == 3


def test_sign_alone_with_an_unsigned_image_is_accepted(build_sign: Obj) -> None:
    del cases.container(build_sign)["build"]
    del cases.mapping(build_sign, 0)["build"]
    cases.mapping(build_sign, 1)["sign"] = {"unsignedImage": "r/kmod:${KERNEL_XYZ}-unsigned"}
    cases.container(build_sign)["sign"]["unsignedImage"] = "r/kmod:unsigned"
    validation.parse_module(copy.deepcopy(build_sign))


def test_mapping_level_only_as_kmms_ci_writes_it(build_sign: Obj) -> None:
    """Build and sign in one kernel mapping only, the TLS objects a Go client
    writes for unset structs ({}), kanikoParams: KMM's CI Module's shape."""
    container = cases.container(build_sign)
    build, sign = container.pop("build"), container.pop("sign")
    container["kernelMappings"] = [
        {
            "regexp": "^.+$",
            "containerImage": "host:5000/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION",
            "registryTLS": {"insecure": True},
            "build": {**build, "baseImageRegistryTLS": {}},
            "sign": {**sign, "unsignedImageRegistryTLS": {}},
        }
    ]
    del container["containerImage"]
    module = validation.parse_module(copy.deepcopy(build_sign))
    assert _dump(module) == build_sign


def test_digest_images_stay_allowed_without_build_or_sign(build_sign: Obj) -> None:
    container = cases.container(build_sign)
    del container["build"], container["sign"]
    del cases.mapping(build_sign, 0)["build"], cases.mapping(build_sign, 0)["sign"]
    container["containerImage"] = "r/kmod@sha256:" + "b" * 64
    validation.parse_module(build_sign)


def test_files_follow_a_custom_dir_name(build_sign: Obj) -> None:
    container = cases.container(build_sign)
    container["modprobe"]["dirName"] = "/srv"
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(copy.deepcopy(build_sign))
    # Three entries, at both levels, each named.
    assert str(caught.value).count(cases.UNDER_DIR_NAME) == 3
    for sign in (container["sign"], cases.mapping(build_sign, 0)["sign"]):
        sign["filesToSign"] = [f.replace("/opt/", "/srv/") for f in sign["filesToSign"]]
    validation.parse_module(build_sign)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in cases.CASES])
def test_broken_rule_names_field_and_rule(case: cases.Case, build_sign: Obj) -> None:
    case.mutate(build_sign)
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(build_sign)
    found = [(v.path, v.message) for v in caught.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found


def test_unknown_build_and_sign_fields_are_refused(build_sign: Obj) -> None:
    cases.container(build_sign)["build"]["dockerfile"] = "FROM scratch"
    cases.container(build_sign)["sign"]["kanikoParams"] = {}
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(build_sign)
    assert sorted(v.path for v in caught.value.violations) == [
        "spec.moduleLoader.container.build.dockerfile",
        "spec.moduleLoader.container.sign.kanikoParams",
    ]


def test_status_images_and_rebuild_generation() -> None:
    status = modules.ModuleStatus.model_validate(
        {
            "imageRebuildTriggerGeneration": 2,
            "images": [
                {"kernel": "6.1.0-27-amd64", "image": "r/k:6.1.0-27-amd64", "state": "Exists"},
                {
                    "kernel": "6.8.0-45-generic",
                    "image": "r/k:6.8.0-45-generic",
                    "state": "BuildFailed",
                    "pod": "k-build-6-8-0-45-generic",
                    "message": "step 3: make: *** [all] Error 2",
                },
            ],
        }
    )
    assert status.image_rebuild_trigger_generation == 2
    assert [i.state for i in status.images or ()] == ["Exists", "BuildFailed"]
    with pytest.raises(ValueError, match="Exists"):
        modules.ImageStatus.model_validate({"kernel": "k", "image": "i", "state": "Built"})
