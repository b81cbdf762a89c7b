"""The requeue policy table and the controller loop around it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import prometheus_client
import pytest

from kmm.aio import clocks
from kmm.runtime import controllers, workqueue

from . import helpers

Result = controllers.Result
Action = controllers.Action


@pytest.mark.parametrize(
    ("outcome", "action", "label", "delay"),
    [
        (Result(), Action.FORGET, "success", None),
        (Result(requeue=True), Action.RATE_LIMITED, "requeue", None),
        (Result(requeue_after=30.0), Action.REQUEUE_AFTER, "requeue", 30.0),
        (Result(requeue=True, requeue_after=5.0), Action.REQUEUE_AFTER, "requeue", 5.0),
        (Result(requeue_after=0.0), Action.FORGET, "success", None),
        (RuntimeError("boom"), Action.RATE_LIMITED, "error", None),
        (controllers.TerminalError("bad spec"), Action.FORGET, "terminal", None),
    ],
)
def test_decide(
    outcome: Result | BaseException, action: Action, label: str, delay: float | None
) -> None:
    assert controllers.decide(outcome) == controllers.Decision(action, label, delay)


class Scripted:
    """A reconciler answering from a per-key script and recording calls."""

    def __init__(self, script: dict[str, list[Result | Exception]]) -> None:
        self.script = script
        self.calls: list[str] = []
        self.called = asyncio.Event()

    async def reconcile(self, key: str) -> Result:
        self.calls.append(key)
        self.called.set()
        answers = self.script.get(key) or [Result()]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str]] = []
        self.depths: list[int] = []

    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        self.outcomes.append((controller, outcome))

    def queue_depth(self, controller: str, depth: int) -> None:
        self.depths.append(depth)


def make(
    reconciler: controllers.Reconciler, clock: clocks.FakeClock
) -> tuple[controllers.Controller, Recorder]:
    metrics = Recorder()
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(
        "c", clock, backoff=workqueue.ItemBackoff(base=1.0, max_delay=60.0)
    )
    controller = controllers.Controller("c", reconciler, queue=queue, metrics=metrics, clock=clock)
    return controller, metrics


async def test_success_forgets_the_key() -> None:
    clock = clocks.FakeClock()
    controller, metrics = make(Scripted({}), clock)
    controller.enqueue("ns/a")
    assert await controller.process_one()
    assert metrics.outcomes == [("c", "success")]
    clock.advance(1000.0)
    assert len(controller.queue) == 0


async def test_error_is_retried_with_growing_backoff_then_forgotten_on_success() -> None:
    clock = clocks.FakeClock()
    reconciler = Scripted({"k": [RuntimeError("1"), RuntimeError("2"), Result()]})
    controller, metrics = make(reconciler, clock)
    controller.enqueue("k")
    await controller.process_one()
    clock.advance(0.999)
    assert len(controller.queue) == 0
    clock.advance(0.001)
    await controller.process_one()
    clock.advance(1.999)
    assert len(controller.queue) == 0
    clock.advance(0.001)
    await controller.process_one()
    assert reconciler.calls == ["k", "k", "k"]
    assert [o for _, o in metrics.outcomes] == ["error", "error", "success"]
    assert controller.queue.failures("k") == 0


async def test_terminal_error_is_not_retried() -> None:
    clock = clocks.FakeClock()
    controller, metrics = make(Scripted({"k": [controllers.TerminalError("no")]}), clock)
    controller.enqueue("k")
    await controller.process_one()
    clock.advance(10_000.0)
    assert len(controller.queue) == 0
    assert controller.queue.delayed == 0
    assert metrics.outcomes == [("c", "terminal")]


async def test_requeue_after_comes_back_after_exactly_that_delay() -> None:
    clock = clocks.FakeClock()
    controller, _ = make(Scripted({"k": [Result(requeue_after=30.0), Result()]}), clock)
    controller.enqueue("k")
    await controller.process_one()
    clock.advance(29.0)
    assert len(controller.queue) == 0
    clock.advance(1.0)
    assert len(controller.queue) == 1


async def test_one_worker_per_key_and_requeue_of_a_key_changed_meanwhile() -> None:
    clock = clocks.FakeClock()
    release = asyncio.Event()
    running: list[str] = []
    peak = 0

    class Slow:
        async def reconcile(self, key: str) -> Result:
            nonlocal peak
            running.append(key)
            peak = max(peak, running.count(key))
            await release.wait()
            running.remove(key)
            return Result()

    controller, metrics = make(Slow(), clock)
    controller.workers = 3
    stop = asyncio.Event()
    controller.enqueue("k")
    runner = asyncio.ensure_future(controller.run(stop))
    await helpers.settle(lambda: bool(running))
    controller.enqueue("k")  # changed while being reconciled
    for _ in range(5):
        await asyncio.sleep(0)
    assert running == ["k"]
    release.set()
    await helpers.settle(lambda: len(metrics.outcomes) == 2)
    assert peak == 1
    stop.set()
    await runner


async def test_run_stops_on_stop_and_shuts_the_queue_down() -> None:
    clock = clocks.FakeClock()
    controller, _ = make(Scripted({}), clock)
    stop = asyncio.Event()
    runner = asyncio.ensure_future(controller.run(stop))
    controller.enqueue("a")
    await helpers.settle(lambda: len(controller.queue) == 0)
    stop.set()
    await runner
    assert controller.queue.shutting_down


async def test_prometheus_metrics_count_outcomes() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = controllers.PrometheusMetrics(registry)
    metrics.reconciled("c", "success", 0.5)
    metrics.reconciled("c", "error", 0.1)
    metrics.queue_depth("c", 7)
    sample: Callable[..., float | None] = registry.get_sample_value
    assert (
        sample("controller_runtime_reconcile_total", {"controller": "c", "result": "success"}) == 1
    )
    assert sample("controller_runtime_reconcile_errors_total", {"controller": "c"}) == 1
    assert sample("controller_runtime_reconcile_time_seconds_count", {"controller": "c"}) == 2
    assert sample("workqueue_depth", {"name": "c"}) == 7


async def test_stop_lets_an_in_flight_reconcile_finish() -> None:
    clock = clocks.FakeClock()
    entered = asyncio.Event()
    release = asyncio.Event()
    finished: list[str] = []

    class Busy:
        async def reconcile(self, key: str) -> Result:
            entered.set()
            await release.wait()
            finished.append(key)
            return Result()

    controller, _ = make(Busy(), clock)
    controller.workers = 2
    stop = asyncio.Event()
    controller.enqueue("k")
    runner = asyncio.ensure_future(controller.run(stop))
    await entered.wait()
    stop.set()
    await helpers.settle(lambda: controller.queue.shutting_down)
    assert not runner.done()
    release.set()
    await runner
    assert finished == ["k"]
