"""Which claims a pod and its containers use, as the 1.37 kubelet resolves them."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.kubelet import podclaims


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
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "claims": [{"name": "direct", "request": "gpu"}, {"name": "direct"}],
                        "requests": {"example.com/gpu": "1", "example.com/none": "0", "cpu": "1"},
                    },
                }
            ],
        },
        "status": status,
    }


def test_a_named_claim_is_taken_as_is_and_a_templates_from_the_status() -> None:
    pod = _pod(resourceClaimStatuses=[{"name": "templated", "resourceClaimName": "p-templated-x"}])
    claims = pod["spec"]["resourceClaims"]
    assert podclaims.claim_name(pod, claims[0]) == ("shared", False)
    assert podclaims.claim_name(pod, claims[1]) == ("p-templated-x", True)


def test_a_templates_claim_not_made_yet_is_named_in_the_librarys_words() -> None:
    pod = _pod()
    with pytest.raises(podclaims.UnknownClaim) as caught:
        podclaims.claim_name(pod, pod["spec"]["resourceClaims"][1])
    assert str(caught.value) == 'pod "ns/p": ResourceClaim not created yet'


def test_every_pod_claim_is_prepared_used_or_not_and_the_extended_resources_claim_too() -> None:
    pod = _pod(extendedResourceClaimStatus={"resourceClaimName": "p-extended-x"})
    names = [c.get("name") or c.get("resourceClaimName") for c in podclaims.pod_claims(pod)]
    assert names == ["direct", "templated", "unused", "p-extended-x"]
    assert [c.get("name") for c in podclaims.pod_claims(_pod())] == [
        "direct",
        "templated",
        "unused",
    ]


def test_a_containers_requests_include_its_extended_resources_mapped_to_requests() -> None:
    pod = _pod(
        extendedResourceClaimStatus={
            "resourceClaimName": "p-extended-x",
            "requestMappings": [
                {"containerName": "main", "resourceName": "example.com/gpu", "requestName": "r0"},
                # a zero request maps to nothing; another container's neither
                {"containerName": "main", "resourceName": "example.com/none", "requestName": "r1"},
                {"containerName": "other", "resourceName": "example.com/gpu", "requestName": "r2"},
            ],
        }
    )
    main = pod["spec"]["containers"][0]
    assert podclaims.container_requests(pod, main) == {
        "shared": ["gpu", ""],
        "p-extended-x": ["r0"],
    }


def test_dra_extended_resource_names() -> None:
    assert podclaims.is_dra_extended_resource("example.com/gpu")
    assert podclaims.is_dra_extended_resource("deviceclass.resource.kubernetes.io/gpu")
    assert not podclaims.is_dra_extended_resource("cpu")
    assert not podclaims.is_dra_extended_resource("hugepages.kubernetes.io/2Mi")
    assert not podclaims.is_dra_extended_resource("requests.example.com/gpu")
    assert podclaims.base_request("r/sub") == "r"


def test_health_finds_a_claim_through_the_status_or_else_the_spec() -> None:
    pod = _pod(resourceClaimStatuses=[{"name": "templated", "resourceClaimName": "p-templated-x"}])
    assert podclaims.status_claim_name(pod, "templated") == "p-templated-x"
    # Named directly in the spec: 1.35 found nothing here, 1.37 finds it.
    assert podclaims.status_claim_name(pod, "direct") == "shared"
    assert podclaims.status_claim_name(_pod(), "templated") is None  # not made yet
    assert podclaims.status_claim_name(pod, "nowhere") is None
