"""The KubeletConfiguration every sandbox node starts from.

Fake-runtime, container and VM nodes run the same pinned kubelet under the
same policy: authenticated and authorized by the API server (no read-only
port, no anonymous access), registering itself, never evicting for a full
disk or memory (a shared disk may run full; a sandbox node must not evict
for it), reporting its status every 10 s, and told the cluster DNS address
a real cluster's kubelets are told (no DNS serves it: nothing outside is
reachable; without it every ClusterFirst pod gets MissingClusterDNS). Each
kind adds its runtime, cgroups and where it listens (``base`` says what
varies).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["base"]


def base(
    *,
    port: int,
    healthz_address: str,
    healthz_port: int,
    client_ca: str,
    feature_gates: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The shared part: the kubelet's port on every address of its node, its
    health on ``healthz_address``, clients' certificates checked against
    ``client_ca``, the release's ``feature_gates`` (``kubereleases``)."""
    gates = {"featureGates": dict(feature_gates)} if feature_gates else {}
    return {
        **gates,
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "0.0.0.0",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": healthz_address,
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "failSwapOn": False,
        "registerNode": True,
        "serializeImagePulls": False,
        "evictionHard": {"memory.available": "1Mi"},
        "mergeDefaultEvictionSettings": False,
        "imageGCHighThresholdPercent": 100,
        "nodeStatusReportFrequency": "10s",
        "clusterDNS": ["10.96.0.10"],
        "clusterDomain": "cluster.local",
    }
