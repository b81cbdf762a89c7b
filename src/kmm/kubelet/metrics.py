"""The emulator's metrics: DRA calls per driver, their errors and durations.

``kmm_kubelet_dra_operations_total{operation,driver,result}`` counts
NodePrepareResources / NodeUnprepareResources calls (``result`` ``ok`` or
``error``); ``kmm_kubelet_dra_operation_duration_seconds{operation,driver}``
their latency as the emulator sees it. Beside them, what the kubelet's own
``/metrics`` shows and a test uses to know the emulator had its turn:
``kmm_kubelet_dra_pod_operations_total{operation,result}`` counts each
preparation (``PrepareResources``) and unpreparation (``UnprepareResources``)
of all of a pod's claims, whether or not a driver had to be called (the
kubelet's ``dra_operations_duration_seconds_count{operation_name}``);
``kmm_kubelet_pod_syncs_total`` the passes of the pod loop over the node's
pods (as ``kubelet_pod_worker_duration_seconds_count`` counts pod syncs);
``kmm_kubelet_driver_absences_total{driver,outcome}`` how each absence of a
driver (no usable plugin) ended: ``returned`` within the wipe delay, or
``wiped``. A registry of its own, so two emulators in one process (tests) do
not share counts.
"""

from __future__ import annotations

import prometheus_client

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.operations = prometheus_client.Counter(
            "kmm_kubelet_dra_operations",
            "DRA calls to drivers, by operation, driver and result.",
            ("operation", "driver", "result"),
            registry=self.registry,
        )
        self.durations = prometheus_client.Histogram(
            "kmm_kubelet_dra_operation_duration_seconds",
            "Latency of DRA calls to drivers as the emulator sees it.",
            ("operation", "driver"),
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )

        self.pod_operations = prometheus_client.Counter(
            "kmm_kubelet_dra_pod_operations",
            "Preparations and unpreparations of all of a pod's claims, by result.",
            ("operation", "result"),
            registry=self.registry,
        )
        self.pod_syncs = prometheus_client.Counter(
            "kmm_kubelet_pod_syncs",
            "Passes of the pod loop over the node's pods.",
            registry=self.registry,
        )
        self.driver_absences = prometheus_client.Counter(
            "kmm_kubelet_driver_absences",
            "Ended absences of a driver: returned within the wipe delay, or wiped.",
            ("driver", "outcome"),
            registry=self.registry,
        )

    def observe(self, operation: str, driver: str, seconds: float, *, ok: bool) -> None:
        self.operations.labels(operation, driver, "ok" if ok else "error").inc()
        self.durations.labels(operation, driver).observe(seconds)

    def scrape(self) -> tuple[int, bytes, str]:
        return (
            200,
            prometheus_client.generate_latest(self.registry),
            prometheus_client.CONTENT_TYPE_LATEST,
        )
