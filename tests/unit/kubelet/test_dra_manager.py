"""The DRA manager's pure parts: which claim a pod claim names, and which are used."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.kubelet import checkpoint, dra


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "templated", "resourceClaimTemplateName": "t"},
                {"name": "unused", "resourceClaimName": "other"},
            ],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "templated"}]}}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "direct"}]}}],
        },
        "status": status,
    }


def test_a_named_claim_is_taken_as_is_and_a_templates_from_the_status() -> None:
    pod = _pod(resourceClaimStatuses=[{"name": "templated", "resourceClaimName": "p-templated-x"}])
    claims = pod["spec"]["resourceClaims"]
    assert dra.claim_name(pod, claims[0]) == ("shared", False)
    assert dra.claim_name(pod, claims[1]) == ("p-templated-x", True)


def test_a_templates_claim_not_made_yet_fails_the_prepare() -> None:
    pod = _pod()
    with pytest.raises(dra.PrepareError, match="unable to find ResourceClaim"):
        dra.claim_name(pod, pod["spec"]["resourceClaims"][1])


def test_claims_no_container_names_are_not_used() -> None:
    pod = _pod()
    assert dra.uses_claim(pod, "direct")
    assert dra.uses_claim(pod, "templated")  # an init container counts
    assert not dra.uses_claim(pod, "unused")


def test_claim_info_round_trips_through_the_checkpoint_unprepared() -> None:
    state = checkpoint.ClaimState(
        claim_uid="u",
        claim_name="c",
        namespace="ns",
        pod_uids=frozenset({"a", "b"}),
        driver_state={"d.example.com": (checkpoint.Device("pool", "dev", None, ("r",), ("x=y",)),)},
    )
    info = dra.ClaimInfo.of(state)
    assert not info.prepared
    assert info.state() == state
