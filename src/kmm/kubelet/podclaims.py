"""Which ResourceClaims a pod and each of its containers use, as the 1.37 kubelet finds them.

``claim_name`` is ``resourceclaim.Name`` (k8s.io/dynamic-resource-allocation):
a pod claim names its ResourceClaim, or a template's claim is looked up in
``pod.status.resourceClaimStatuses`` (and must then be the pod's own).
``pod_claims`` is the list the DRA manager prepares: every entry of
``pod.spec.resourceClaims``, whether or not a container names it, plus the
claim the scheduler made for extended resources backed by DRA
(``pod.status.extendedResourceClaimStatus``; ``DRAExtendedResource`` is GA
and locked on in 1.37). ``container_requests`` is what ``GetResources``
hands the runtime for one container: per claim name, the requests it uses
(``""``: the whole claim), extended resource requests mapped through the
status' ``requestMappings``. ``status_claim_name`` is how the kubelet finds a
container's claim when it writes the devices' health.

The names of the API objects' fields are the API's; errors carry the
library's words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = [
    "DEVICE_CLASS_PREFIX",
    "UnknownClaim",
    "base_request",
    "claim_name",
    "container_requests",
    "is_dra_extended_resource",
    "pod_claims",
    "status_claim_name",
]

# resourceapi.ResourceDeviceClassPrefix: an extended resource named after a DeviceClass.
DEVICE_CLASS_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
_NUMBER: Final = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)")


class UnknownClaim(Exception):
    """A pod claim whose ResourceClaim cannot be named (yet)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def claim_name(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The ResourceClaim's name for one pod claim (None: intentionally none),
    and whether the claim must be checked to be the pod's own (a template's)."""
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"]), False
    meta = _meta(pod)
    if pod_claim.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("name") == pod_claim.get("name"):
                name = status.get("resourceClaimName")
                return (str(name) if name else None), True
        raise UnknownClaim(
            f'pod "{meta.get("namespace")}/{meta.get("name")}": ResourceClaim not created yet'
        )
    raise UnknownClaim(
        f'pod "{meta.get("namespace")}/{meta.get("name")}", spec.resourceClaim '
        f'"{pod_claim.get("name")}": none of the supported fields are set'
    )


def pod_claims(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod claims the manager prepares, the extended resources' claim last."""
    found: list[Mapping[str, Any]] = list((pod.get("spec") or {}).get("resourceClaims") or ())
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if extended:
        # The kubelet makes a nameless pod claim of it (manager.go: prepareResources).
        found.append({"resourceClaimName": extended.get("resourceClaimName")})
    return found


def status_claim_name(pod: Mapping[str, Any], pod_claim: str) -> str | None:
    """The ResourceClaim of a pod claim as ``UpdateAllocatedResourcesStatus``
    finds it: through ``pod.status.resourceClaimStatuses``, else from the pod
    spec (1.37 added that: a claim named directly in the spec gets health
    entries too, where 1.35 gave it none); None when neither names one."""
    found = None
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if status.get("name") == pod_claim and status.get("resourceClaimName"):
            found = str(status["resourceClaimName"])  # the last one, as Go's map keeps
    if found is not None:
        return found
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("name") == pod_claim:
            try:
                return claim_name(pod, entry)[0]
            except UnknownClaim:
                return None
    return None


def base_request(reference: str) -> str:
    """``resourceclaim.BaseRequestRef``: a ``request/subrequest`` reference's request."""
    return reference.split("/")[0]


def is_dra_extended_resource(name: str) -> bool:
    """``schedutil.IsDRAExtendedResourceName``: an extended resource (outside
    ``kubernetes.io/``) or one named after a DeviceClass. The API server has
    already checked the name's syntax, so that part is not repeated."""
    if name.startswith(DEVICE_CLASS_PREFIX):
        return True
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _nonzero(quantity: object) -> bool:
    # Any unit scales a zero to zero: the leading number decides.
    found = _NUMBER.match(str(quantity))
    return found is None or float(found[1]) != 0


def container_requests(
    pod: Mapping[str, Any], container: Mapping[str, Any]
) -> dict[str, list[str]]:
    """Per ResourceClaim name, the requests one container uses (``""``: all of
    the claim), in the kubelet's order; UnknownClaim as ``claim_name``."""
    used: dict[str, list[str]] = {}
    for claim in (container.get("resources") or {}).get("claims") or ():
        used.setdefault(str(claim.get("name")), []).append(str(claim.get("request") or ""))
    found: dict[str, list[str]] = {}
    for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or ():
        requests = used.get(str(pod_claim.get("name")))
        if requests is None:
            continue
        name, _ = claim_name(pod, pod_claim)
        if name is not None:
            found.setdefault(name, []).extend(requests)
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if extended:
        wanted = {
            resource
            for resource, quantity in (
                (container.get("resources") or {}).get("requests") or {}
            ).items()
            if _nonzero(quantity) and is_dra_extended_resource(resource)
        }
        mapped = _mapped(extended.get("requestMappings") or (), container, wanted)
        if mapped:
            found.setdefault(str(extended.get("resourceClaimName")), []).extend(mapped)
    return found


def _mapped(
    mappings: Sequence[Mapping[str, Any]], container: Mapping[str, Any], wanted: set[str]
) -> list[str]:
    return [
        str(m.get("requestName"))
        for m in mappings
        if m.get("containerName") == container.get("name") and m.get("resourceName") in wanted
    ]
