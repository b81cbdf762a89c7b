from __future__ import annotations

import pytest

from kmm.kubeletplugin import claims, errors, plugins

from . import fakes


def test_claim_configs_class_first_and_only_this_driver() -> None:
    configs = [
        {"source": "FromClaim", "opaque": {"driver": fakes.DRIVER, "parameters": {"n": 1}}},
        {"source": "FromClass", "opaque": {"driver": "other.example.com", "parameters": {}}},
        {"source": "FromClass", "opaque": {"driver": fakes.DRIVER, "parameters": {"n": 0}}},
    ]
    claim = fakes.make_claim(configs=configs)
    picked = claims.claim_configs(claim, fakes.DRIVER)
    assert [c["opaque"]["parameters"] for c in picked] == [{"n": 0}, {"n": 1}]


def test_driver_results_skip_other_drivers() -> None:
    other = {"request": "x", "driver": "other.example.com", "pool": "p", "device": "d"}
    claim = fakes.make_claim(devices=("dev0",), extra_results=[other])
    assert [r["device"] for r in claims.driver_results(claim, fakes.DRIVER)] == ["dev0"]


@pytest.mark.parametrize(
    ("namespace", "name", "uid"),
    [("a", "b", "x/y"), ("a", "b/c", "u"), ("A", "b", "u"), ("a", "b", "-u"), ("a", "", "u")],
)
def test_validate_ref_refuses_unsafe(namespace: str, name: str, uid: str) -> None:
    with pytest.raises(errors.UnsafeClaimError):
        claims.validate_ref(claims.ClaimRef(namespace, name, claims.ClaimUID(uid)))


def test_driver_name_of_a_policy() -> None:
    assert plugins.driver_name("kmod") == "kmod.kmm.sigs.x-k8s.io"
