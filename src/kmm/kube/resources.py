"""API paths: which resource, in which namespace, which object, which subresource.

``Resource`` knows its group, version and plural and builds the request path
for it; every path segment taken from outside (a name, a namespace) is
percent-quoted, so a name can never climb out of its place in the URL. The
resources kmm speaks to are named here; a custom resource is one line where
it is used (``Resource("kmm.sigs.x-k8s.io", "v1beta1", "modules")``).
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Final

__all__ = [
    "CRDS",
    "DAEMONSETS",
    "DEVICE_CLASSES",
    "DEVICE_TAINT_RULES",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "SERVICE_ACCOUNTS",
    "VALIDATING_ADMISSION_POLICIES",
    "VALIDATING_ADMISSION_POLICY_BINDINGS",
    "Resource",
    "base_path",
]


def base_path(api_version: str) -> str:
    """``/api/v1`` for the core group, ``/apis/<group>/<version>`` otherwise."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _segment(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"empty {what}")
    return urllib.parse.quote(value, safe="")


@dataclasses.dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        *,
        subresource: str | None = None,
    ) -> str:
        """The collection (no ``name``) or object path; ``namespace`` None lists across all."""
        path = base_path(self.api_version)
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are not namespaced")
            path += f"/namespaces/{_segment(namespace, 'namespace')}"
        path += f"/{self.plural}"
        if name is not None:
            path += f"/{_segment(name, 'name')}"
        if subresource is not None:
            if name is None:
                raise ValueError("a subresource needs a name")
            path += f"/{subresource}"
        return path


NAMESPACES: Final = Resource("", "v1", "namespaces", namespaced=False)
NODES: Final = Resource("", "v1", "nodes", namespaced=False)
PODS: Final = Resource("", "v1", "pods")
SERVICE_ACCOUNTS: Final = Resource("", "v1", "serviceaccounts")
EVENTS: Final = Resource("", "v1", "events")
DAEMONSETS: Final = Resource("apps", "v1", "daemonsets")
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases")
RESOURCE_CLAIMS: Final = Resource("resource.k8s.io", "v1", "resourceclaims")
RESOURCE_SLICES: Final = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
DEVICE_CLASSES: Final = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
# GA in 1.37; v1beta2 in 1.36, v1alpha3 in 1.35 (``dataclasses.replace`` the
# version the server serves: ``kmm.operator.deviceapis``).
DEVICE_TAINT_RULES: Final = Resource("resource.k8s.io", "v1", "devicetaintrules", namespaced=False)
CRDS: Final = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
VALIDATING_ADMISSION_POLICIES: Final = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", namespaced=False
)
VALIDATING_ADMISSION_POLICY_BINDINGS: Final = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", namespaced=False
)
