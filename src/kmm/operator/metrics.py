"""The operator's Prometheus metrics, on a registry of its own.

Controller metrics come from ``runtime.controllers.PrometheusMetrics``
(reconciles by outcome, errors, durations, queue depth). On top of them:
``kmm_api_writes_total{verb,resource}``, read at scrape time from the
request counter of the operator's API client (``kube.counting``; so a
test or an admin can see that only the leader writes, and that a converged
cluster costs none), ``kmm_leader`` (1 while this replica leads), the
cached object counts per informer,
``kmm_handler_errors_total{informer,method}``: event-handler calls that
raised (each an event lost to the queue until the resync heals it), so a
failing mapping is seen on a dashboard rather than only in a log line, and
two faults the API server inflicts: ``kmm_api_throttled_total{verb,resource}``
(requests it answered 429; the client waited for its Retry-After and sent
them again) and ``kmm_informer_relists_total{informer,reason}`` (completed
lists: ``start``, or ``gone`` after a 410 said the watch had expired, by
compaction or because the server's watch cache had moved on).
Build and sign: ``kmm_registry_requests_total`` (HTTP requests the image
existence checks sent; a converged cluster sends none) and
``kmm_registry_checks_total{outcome}`` (checks by what they found).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import prometheus_client
from prometheus_client import core, registry

from kmm.kube import counting
from kmm.runtime import controllers

__all__ = ["OperatorMetrics", "RegistryCounts", "Relists"]


#: (informer, reason) -> completed lists; ``wiring.Operator.relists``.
Relists = Callable[[], Mapping[tuple[str, str], int]]
#: Registry requests, and checks by outcome; ``wiring.Operator.registry_requests``.
RegistryCounts = Callable[[], tuple[int, Mapping[str, int]]]


def _no_registry() -> tuple[int, Mapping[str, int]]:
    return 0, {}


class _Collector(registry.Collector):
    def __init__(
        self,
        counter: counting.RequestCounter,
        leading: Callable[[], bool],
        cached: Callable[[], Mapping[str, int]],
        relists: Relists,
        registry_counts: RegistryCounts,
    ) -> None:
        self._counter = counter
        self._leading = leading
        self._cached = cached
        self._relists = relists
        self._registry = registry_counts

    def collect(self) -> Iterator[core.Metric]:
        by_request = ["verb", "resource"]
        yield _counters(
            "kmm_api_writes", "API writes sent by this replica.", by_request, self._counter.writes
        )
        yield _counters(
            "kmm_api_throttled",
            "Requests the API server answered 429 (each sent again after its Retry-After).",
            by_request,
            self._counter.throttled,
        )
        yield _counters(
            "kmm_informer_relists",
            "Completed informer lists, by reason: start, or gone (a 410: the watch expired).",
            ["informer", "reason"],
            self._relists(),
        )
        requests, checks = self._registry()
        yield core.CounterMetricFamily(
            "kmm_registry_requests",
            "HTTP requests sent to registries by image existence checks.",
            value=requests,
        )
        checked = core.CounterMetricFamily(
            "kmm_registry_checks",
            "Image existence checks, by outcome.",
            labels=["outcome"],
        )
        for outcome, count in sorted(checks.items()):
            checked.add_metric([outcome], count)
        yield checked
        yield core.GaugeMetricFamily(
            "kmm_leader", "1 while this replica holds the lease.", value=int(self._leading())
        )
        cached = core.GaugeMetricFamily(
            "kmm_cached_objects", "Objects in each informer cache.", labels=["informer"]
        )
        for name, count in sorted(self._cached().items()):
            cached.add_metric([name], count)
        yield cached


def _counters(
    name: str, documentation: str, labels: list[str], counts: Mapping[tuple[str, str], int]
) -> core.CounterMetricFamily:
    family = core.CounterMetricFamily(name, documentation, labels=labels)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key), count)
    return family


class OperatorMetrics:
    """Everything ``/metrics`` serves for one operator process."""

    def __init__(
        self,
        counter: counting.RequestCounter,
        *,
        leading: Callable[[], bool],
        cached: Callable[[], Mapping[str, int]],
        relists: Relists = dict,
        registry_counts: RegistryCounts = _no_registry,
    ) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.controllers = controllers.PrometheusMetrics(self.registry)
        self.registry.register(_Collector(counter, leading, cached, relists, registry_counts))
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
