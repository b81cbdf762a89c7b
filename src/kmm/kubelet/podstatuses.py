"""A pod's status as the kubelet writes it, from the run of its containers.

``StatusWriter.write`` patches ``status``: the phase (the run's, or the one
given), the pod conditions, the container statuses (``processes.PodRun``),
the node's address as host and pod IP, and the start time. With
``resource_health`` (the kubelet's ``ResourceHealthStatus`` gate) each
running container's ``allocatedResourcesStatus`` says the health of its
claims' devices, with their messages (``health``), the claims found as the
1.37 kubelet finds them. When a status is written is the pod workers' call
(``podworkers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kmm.kube import client, errors, resources
from kmm.kubelet import checkpoint, dra, health, podclaims, processes

__all__ = ["KUBELET_CONDITIONS", "StatusWriter", "pod_conditions"]

# pkg/kubelet/types: PodConditionsByKubelet, with the gated ones on in 1.37
# (PodReadyToStartContainers, GA; AllContainersRestarting, beta).
KUBELET_CONDITIONS: Final = frozenset(
    {
        "PodScheduled",
        "Ready",
        "Initialized",
        "ContainersReady",
        "PodResizeInProgress",
        "PodResizePending",
        "PodReadyToStartContainers",
        "AllContainersRestarting",
    }
)


def pod_conditions(
    pod: Mapping[str, Any], *, initialized: bool, ready: bool, started: str
) -> list[dict[str, Any]]:
    """The conditions to write: those others own kept as the pod has them (a
    merge patch replaces the whole list; the kubelet's mergePodStatus keeps
    them, DisruptionTarget from device-taint eviction among them), then the
    kubelet's own, PodScheduled carried over as the kubelet carries it."""
    found = [
        c
        for c in (pod.get("status") or {}).get("conditions") or ()
        if c.get("type") not in KUBELET_CONDITIONS
    ]
    scheduled = next(
        (
            c
            for c in (pod.get("status") or {}).get("conditions") or ()
            if c.get("type") == "PodScheduled"
        ),
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
    )
    found.append(dict(scheduled))
    found.extend(
        {"type": kind, "status": str(value), "lastTransitionTime": started}
        for kind, value in (
            ("PodReadyToStartContainers", True),
            ("Initialized", initialized),
            ("Ready", ready),
            ("ContainersReady", ready),
        )
    )
    return found


class StatusWriter:
    """Writes the status of one node's pods."""

    def __init__(
        self,
        api: client.Client,
        *,
        address: str,
        manager: dra.Manager,
        health_cache: health.Cache | None,
    ) -> None:
        self._api = api
        self._address = address
        self._manager = manager
        # None: the ResourceHealthStatus gate is off.
        self._health = health_cache

    async def write(
        self,
        pod: Mapping[str, Any],
        run: processes.PodRun,
        *,
        started: str,
        phase: str | None = None,
    ) -> bool:
        """The pod's status from its run; False when the pod is gone."""
        conditions = pod_conditions(
            pod, initialized=run.initialized, ready=run.ready, started=started
        )
        status: dict[str, Any] = {
            "phase": phase or run.phase,
            "conditions": conditions,
            "containerStatuses": self._container_statuses(pod, run),
            "hostIP": self._address,
            "hostIPs": [{"ip": self._address}],
            "podIP": self._address,
            "podIPs": [{"ip": self._address}],
            "startTime": started,
        }
        if run.init_containers:
            status["initContainerStatuses"] = run.statuses(init=True)
        try:
            await self._api.request(
                "PATCH",
                resources.PODS.path(
                    pod["metadata"]["namespace"], pod["metadata"]["name"], subresource="status"
                ),
                body={"status": status},
                content_type=client.MERGE_PATCH,
            )
        except errors.NotFound:
            return False
        return True

    def _container_statuses(
        self, pod: Mapping[str, Any], run: processes.PodRun
    ) -> list[dict[str, Any]]:
        statuses = run.statuses()
        cache = self._health
        if cache is None:
            return statuses
        specs = {c["name"]: c for c in (pod.get("spec") or {}).get("containers") or ()}
        for status in statuses:
            allocated = health.resource_statuses(
                specs[status["name"]],
                lambda name: self._prepared_devices(pod, name),
                cache.read,
            )
            if allocated:
                status["allocatedResourcesStatus"] = allocated
        return statuses

    def _prepared_devices(
        self, pod: Mapping[str, Any], pod_claim: str
    ) -> Mapping[str, list[checkpoint.Device]] | None:
        """A pod claim's devices by driver (None: not prepared here)."""
        name = podclaims.status_claim_name(pod, pod_claim)
        if name is None:
            return None
        info = self._manager.claims.get((pod["metadata"]["namespace"], name))
        return None if info is None else info.drivers
