"""The operator's Prometheus metrics, on a registry of its own.

Controller metrics come from ``runtime.controllers.PrometheusMetrics``
(reconciles by outcome, errors, durations, queue depth). On top of them:
``kmm_api_writes_total{verb,resource}``, read at scrape time from the
request counter of the operator's API client (``kube.counting``; so a
test or an admin can see that only the leader writes, and that a converged
cluster costs none), ``kmm_leader`` (1 while this replica leads), the
cached object counts per informer, and
``kmm_handler_errors_total{informer,method}``: event-handler calls that
raised (each an event lost to the queue until the resync heals it), so a
failing mapping is seen on a dashboard rather than only in a log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import prometheus_client
from prometheus_client import core, registry

from kmm.kube import counting
from kmm.runtime import controllers

__all__ = ["OperatorMetrics"]


class _Collector(registry.Collector):
    def __init__(
        self,
        counter: counting.RequestCounter,
        leading: Callable[[], bool],
        cached: Callable[[], Mapping[str, int]],
    ) -> None:
        self._counter = counter
        self._leading = leading
        self._cached = cached

    def collect(self) -> Iterator[core.Metric]:
        written = core.CounterMetricFamily(
            "kmm_api_writes", "API writes sent by this replica.", labels=["verb", "resource"]
        )
        for (verb, resource), count in sorted(self._counter.writes.items()):
            written.add_metric([verb, resource], count)
        yield written
        yield core.GaugeMetricFamily(
            "kmm_leader", "1 while this replica holds the lease.", value=int(self._leading())
        )
        cached = core.GaugeMetricFamily(
            "kmm_cached_objects", "Objects in each informer cache.", labels=["informer"]
        )
        for name, count in sorted(self._cached().items()):
            cached.add_metric([name], count)
        yield cached


class OperatorMetrics:
    """Everything ``/metrics`` serves for one operator process."""

    def __init__(
        self,
        counter: counting.RequestCounter,
        *,
        leading: Callable[[], bool],
        cached: Callable[[], Mapping[str, int]],
    ) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.controllers = controllers.PrometheusMetrics(self.registry)
        self.registry.register(_Collector(counter, leading, cached))
        self._handler_errors = prometheus_client.Counter(
            "kmm_handler_errors_total",
            "Informer event-handler calls that raised (the event waits for the resync).",
            ["informer", "method"],
            registry=self.registry,
        )

    def handler_failed(self, informer: str, method: str) -> None:
        """``runtime.informers.HandlerErrors``: one handler call raised."""
        self._handler_errors.labels(informer, method).inc()

    def render(self) -> bytes:
        data: bytes = prometheus_client.generate_latest(self.registry)
        return data
