"""The controller loop and the one place that decides what happens after a reconcile.

A reconciler is level-based and tiny (controller-runtime's contract)::

    class Reconciler(Protocol):
        async def reconcile(self, key: str) -> Result: ...

It returns `Result()` when the world matches the key's desired state,
`Result(requeue_after=s)` to look again later, `Result(requeue=True)` to look
again with backoff, or raises: `TerminalError` is logged and never retried,
any other exception is retried with per-key backoff. `decide` maps an outcome
to a queue action and `apply` performs it; nothing else in the code base
requeues a key. Metrics go through the small `Metrics` protocol
(`PrometheusMetrics` is the production one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from typing import Protocol

import prometheus_client

from kmm.aio import clocks, tasks
from kmm.runtime import workqueue

__all__ = [
    "Action",
    "Controller",
    "Decision",
    "Metrics",
    "NullMetrics",
    "PrometheusMetrics",
    "Reconciler",
    "Result",
    "TerminalError",
    "apply",
    "decide",
]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    requeue: bool = False
    requeue_after: float | None = None


class TerminalError(Exception):
    """A failure retrying cannot fix (invalid spec): logged, key forgotten."""


class Reconciler(Protocol):
    async def reconcile(self, key: str) -> Result: ...


class Action(enum.Enum):
    FORGET = "forget"  # done: reset backoff, wait for the next event
    REQUEUE_AFTER = "requeue_after"  # look again after a fixed delay, backoff reset
    RATE_LIMITED = "rate_limited"  # retry with per-key exponential backoff


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    outcome: str  # metrics label: success | requeue | error | terminal
    delay: float | None = None


def decide(outcome: Result | BaseException) -> Decision:
    """The requeue policy, in one place."""
    if isinstance(outcome, TerminalError):
        return Decision(Action.FORGET, "terminal")
    if isinstance(outcome, BaseException):
        return Decision(Action.RATE_LIMITED, "error")
    # requeue_after wins over requeue, as in controller-runtime.
    if outcome.requeue_after is not None and outcome.requeue_after > 0:
        return Decision(Action.REQUEUE_AFTER, "requeue", outcome.requeue_after)
    if outcome.requeue:
        return Decision(Action.RATE_LIMITED, "requeue")
    return Decision(Action.FORGET, "success")


def apply(queue: workqueue.WorkQueue[str], key: str, decision: Decision) -> None:
    if decision.action is Action.FORGET:
        queue.forget(key)
    elif decision.action is Action.REQUEUE_AFTER:
        queue.forget(key)
        queue.add_after(key, decision.delay or 0.0)
    else:
        queue.add_rate_limited(key)


class Metrics(Protocol):
    def reconciled(self, controller: str, outcome: str, seconds: float) -> None: ...

    def queue_depth(self, controller: str, depth: int) -> None: ...


class NullMetrics:
    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        pass

    def queue_depth(self, controller: str, depth: int) -> None:
        pass


class PrometheusMetrics:
    """controller-runtime's metric names, registered on the given registry."""

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else prometheus_client.REGISTRY
        self.total = prometheus_client.Counter(
            "controller_runtime_reconcile_total",
            "Reconciles per controller and outcome.",
            ["controller", "result"],
            registry=reg,
        )
        self.errors = prometheus_client.Counter(
            "controller_runtime_reconcile_errors_total",
            "Reconciles that raised.",
            ["controller"],
            registry=reg,
        )
        self.duration = prometheus_client.Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Reconcile duration.",
            ["controller"],
            registry=reg,
        )
        self.depth = prometheus_client.Gauge(
            "workqueue_depth",
            "Keys waiting in the queue.",
            ["name"],
            registry=reg,
        )

    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        self.total.labels(controller, outcome).inc()
        if outcome in ("error", "terminal"):
            self.errors.labels(controller).inc()
        self.duration.labels(controller).observe(seconds)

    def queue_depth(self, controller: str, depth: int) -> None:
        self.depth.labels(controller).set(depth)


class Controller:
    """N workers taking keys from one queue and calling one reconciler."""

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        *,
        queue: workqueue.WorkQueue[str] | None = None,
        workers: int = 1,
        metrics: Metrics | None = None,
        clock: clocks.Clock | None = None,
    ) -> None:
        self.name = name
        self.reconciler = reconciler
        self._clock: clocks.Clock = clock or clocks.LoopClock()
        # `is None`, not `or`: an empty queue is falsy (it has __len__).
        self.queue: workqueue.WorkQueue[str] = (
            queue
            if queue is not None
            else workqueue.WorkQueue(
                name, self._clock, bucket=workqueue.BucketRateLimiter(self._clock)
            )
        )
        self.workers = workers
        self.metrics: Metrics = metrics or NullMetrics()

    def enqueue(self, key: str) -> None:
        """What event handlers call; safe before the controller runs."""
        self.queue.add(key)
        self.metrics.queue_depth(self.name, len(self.queue))

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop`; then let in-flight reconciles finish.

        The wait for in-flight work is unbounded here: the manager bounds it
        (its grace period, or none when the lease is lost) by cancelling us.
        """
        workers = tasks.TaskSet(f"controller/{self.name}")
        try:
            for index in range(self.workers):
                workers.spawn(self._work(), name=f"worker-{index}")
            await tasks.wait_first(stop, workers.failed)
            # Idle workers end with QueueShutDown; busy ones finish their key.
            self.queue.shutdown()
            if pending := workers.tasks():
                await asyncio.wait(pending)
        finally:
            self.queue.shutdown()
            await workers.close()
        workers.raise_failure()

    async def process_one(self) -> bool:
        """Reconcile one key; False when the queue is shut down. Public for tests."""
        try:
            key = await self.queue.get()
        except workqueue.QueueShutDown:
            return False
        self.metrics.queue_depth(self.name, len(self.queue))
        started = self._clock.now()
        outcome: Result | BaseException
        try:
            outcome = await self.reconciler.reconcile(key)
        except asyncio.CancelledError:
            self.queue.done(key)
            raise
        except Exception as error:
            outcome = error
        decision = decide(outcome)
        if isinstance(outcome, TerminalError):
            _log.error("%s: %s: terminal error, not retried: %s", self.name, key, outcome)
        elif isinstance(outcome, BaseException):
            _log.warning(
                "%s: %s: reconcile failed (retry %d)",
                self.name,
                key,
                self.queue.failures(key) + 1,
                exc_info=outcome,
            )
        self.metrics.reconciled(self.name, decision.outcome, self._clock.now() - started)
        apply(self.queue, key, decision)
        self.queue.done(key)
        self.metrics.queue_depth(self.name, len(self.queue))
        return True

    async def _work(self) -> None:
        while await self.process_one():
            pass
