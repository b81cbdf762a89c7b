"""The PreflightValidation models: what Python accepts and refuses (the CEL half
of each rule runs on the API server in tests/integration/test_preflight_admission.py
with the same table, tests/preflight_cases.py)."""

from __future__ import annotations

import copy
import re

import preflight_cases as cases
import pytest

from kmm.api import kernels, labels, preflight, validation

Obj = cases.Obj


def _verdict(**changes: object) -> Obj:
    verdict: Obj = {
        "name": "kmod",
        "namespace": "drivers",
        "verificationStatus": "InProgress",
        "verificationStage": "Image",
        "statusReason": preflight.REASON_IN_PROGRESS,
        "lastTransitionTime": "2026-07-01T12:00:00Z",
    }
    verdict.update(changes)
    return verdict


@pytest.mark.parametrize("kernel", cases.GOOD_KERNELS)
def test_kernel_versions_kmm_accepts_are_accepted(kernel: str) -> None:
    parsed = preflight.parse(cases.validation(kernel))
    assert parsed.spec.kernel_version == kernel


def test_push_defaults_to_false_and_the_object_round_trips() -> None:
    obj = cases.validation()
    parsed = preflight.parse(copy.deepcopy(obj))
    assert parsed.spec.push_built_image is False
    assert parsed.model_dump(mode="json", exclude_unset=True) == obj
    pushed = preflight.parse(cases.validation(pushBuiltImage=True))
    assert pushed.spec.push_built_image is True


def test_kernel_trims_one_trailing_plus_as_for_nodes() -> None:
    for written in ("5.14.0-427.el9.x86_64+", "5.14.0-427.el9.x86_64", "6.1.0++"):
        parsed = preflight.parse(cases.validation(written))
        assert preflight.kernel(parsed) == kernels.node_kernel(written)
    assert preflight.kernel(preflight.parse(cases.validation("6.1.0++"))) == "6.1.0+"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in cases.CASES])
def test_each_rule_refuses_naming_the_field(case: cases.Case) -> None:
    obj = cases.validation()
    case.mutate(obj)
    with pytest.raises(preflight.InvalidPreflightValidationError) as refused:
        preflight.parse(obj)
    found = [(v.path, v.message) for v in refused.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found
    assert all(isinstance(v, validation.Violation) for v in refused.value.violations)


def test_refusal_text_names_the_field_and_the_value() -> None:
    with pytest.raises(preflight.InvalidPreflightValidationError) as refused:
        preflight.parse(cases.validation("6.1"))
    assert str(refused.value) == (
        "spec.kernelVersion: kernelVersion '6.1' must split into at least three parts "
        "on '.', ',' or '-' (e.g. 6.1.0-27-amd64)"
    )


def test_the_three_parts_rule_is_kernels_variables_rule() -> None:
    """A kernel the validation admits has KERNEL_X/Y/Z: the image variables
    of every mapping can be expanded for it."""
    for kernel in (*cases.GOOD_KERNELS, "x.y.", ".,"):
        parsed = preflight.parse(cases.validation(kernel))
        found = kernels.variables(preflight.kernel(parsed), module_name="m", module_namespace="n")
        assert found["KERNEL_XYZ"].count(".") == 2


def test_unknown_spec_fields_are_refused() -> None:
    obj = cases.validation()
    obj["spec"]["push"] = True
    with pytest.raises(preflight.InvalidPreflightValidationError) as refused:
        preflight.parse(obj)
    assert [v.path for v in refused.value.violations] == ["spec.push"]


def test_status_verdicts_parse_with_kmms_extensions() -> None:
    obj = cases.validation()
    obj["status"] = {
        "observedGeneration": 2,
        "modules": [
            _verdict(),
            _verdict(
                name="other",
                verificationStatus="Success",
                verificationStage="Done",
                statusReason=preflight.REASON_BUILT + "; pushed r/kmod:6.1.0-27-amd64",
                lastTransitionTime="2026-07-01T12:00:00.123456+02:00",
                image="r/kmod:6.1.0-27-amd64",
                pod="pfv-cases-other",
            ),
        ],
    }
    parsed = preflight.parse(copy.deepcopy(obj))
    assert parsed.status is not None
    assert parsed.status.modules is not None
    assert parsed.status.observed_generation == 2
    assert [v.verification_status for v in parsed.status.modules] == ["InProgress", "Success"]
    assert parsed.model_dump(mode="json", exclude_unset=True) == obj


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("verificationStatus", "Succeeded"),
        ("verificationStage", "Build"),
        ("lastTransitionTime", "2026-07-01 12:00:00"),
        ("lastTransitionTime", "2026-13-01T12:00:00Z"),
        ("lastTransitionTime", "yesterday"),
    ],
)
def test_status_values_outside_the_api_are_refused(field: str, value: str) -> None:
    obj = cases.validation()
    obj["status"] = {"modules": [_verdict(**{field: value})]}
    with pytest.raises(preflight.InvalidPreflightValidationError) as refused:
        preflight.parse(obj)
    assert [v.path for v in refused.value.violations] == [f"status.modules[0].{field}"]


def test_reason_texts_are_kmms() -> None:
    assert preflight.REASON_MAPPING_NOT_FOUND == "mapping not found"
    assert preflight.REASON_IMAGE_EXISTS == "verified image exists"
    assert preflight.REASON_IMAGE_MISSING == "verified image does not exist"
    assert (
        preflight.REASON_BUILD_FAILED == preflight.REASON_IMAGE_MISSING + " and build/sign failed"
    )
    assert preflight.REASON_IN_PROGRESS == "verification is not finished yet"


def test_names() -> None:
    assert preflight.API_VERSION == "kmm.sigs.x-k8s.io/v1beta2"
    assert (preflight.KIND, preflight.PLURAL, preflight.SINGULAR) == (
        "PreflightValidation",
        "preflightvalidations",
        "preflightvalidation",
    )
    assert preflight.SHORT_NAMES == ("pfv",)


def test_preflight_label_value_is_the_name_or_a_cut_with_a_digest() -> None:
    assert labels.PREFLIGHT == "kmm.node.kubernetes.io/preflight"
    assert labels.preflight_value("preflight-x7k2p") == "preflight-x7k2p"
    long_a, long_b = "a" * 63 + ".x", "a" * 63 + ".y"
    assert labels.is_label_value(labels.preflight_value("a" * 63))
    for name in (long_a, long_b, "a" * 253):
        value = labels.preflight_value(name)
        assert labels.is_label_value(value), value
        assert re.search(r"-[0-9a-f]{10}$", value), value
    assert labels.preflight_value(long_a) != labels.preflight_value(long_b)
