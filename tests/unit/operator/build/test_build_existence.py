"""The existence checker's policy, with an ``Ask`` double whose answers the
test releases one by one: facts answered from memory, checks only in the
background (bounded in number and time), requeues when answers land, a
forgotten check never kept, what is asked again and when."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from kmm.operator.build import existence

Obj = dict[str, Any]
_SECRET = {"metadata": {"resourceVersion": "1"}}


class _Registry:
    """``existence.Ask``: each check waits until the test answers it."""

    def __init__(self) -> None:
        self.asked: collections.Counter[str] = collections.Counter()
        self.waiting: dict[str, list[asyncio.Future[existence.Fact]]] = collections.defaultdict(
            list
        )
        self.secrets: list[Obj | None] = []

    async def __call__(self, key: existence.Key, secret: Obj | None) -> existence.Fact:
        self.asked[key.image] += 1
        self.secrets.append(secret)
        answer: asyncio.Future[existence.Fact] = asyncio.get_running_loop().create_future()
        self.waiting[key.image].append(answer)
        return await answer

    def in_flight(self) -> int:
        return sum(1 for found in self.waiting.values() for f in found if not f.done())

    async def answer(self, image: str, state: existence.State, **more: Any) -> None:
        """Answer the oldest open check of ``image``; let it land."""
        found = next(f for f in self.waiting[image] if not f.done())
        found.set_result(existence.Fact(state, **more))
        for _ in range(3):
            await asyncio.sleep(0)


class _Secrets:
    def __init__(self) -> None:
        self.version = "1"
        self.reads = 0

    async def __call__(self, namespace: str, name: str) -> Obj | None:
        self.reads += 1
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": self.version}}


async def _turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def _key(image: str = "r.io/m:1", secret: str = "") -> existence.Key:
    return existence.Key(image, secret=secret)


async def test_no_answer_yet_is_checking_and_the_waiter_is_requeued_when_it_lands() -> None:
    registry, requeued = _Registry(), []
    checker = existence.Checker(registry)
    waiter = existence.Waiter(requeued.append, "ns/m")
    found = checker.fact(_key(), _Secrets(), waiter=waiter)
    assert (found.state, found.pending, found.message) == (
        existence.State.ERROR,
        True,
        existence.CHECKING,
    )
    await _turns()
    assert registry.in_flight() == 1
    again = checker.fact(_key(), _Secrets(), waiter=existence.Waiter(requeued.append, "ns/other"))
    assert again.pending
    assert registry.asked["r.io/m:1"] == 1
    assert requeued == []
    await registry.answer("r.io/m:1", existence.State.EXISTS)
    assert requeued == ["ns/m", "ns/other"]
    assert checker.fact(_key(), _Secrets()) == checker.known(_key())
    assert checker.known(_key()) is not None
    assert checker.known(_key()).state is existence.State.EXISTS  # type: ignore[union-attr]
    assert checker.checks == {"Exists": 1}
    assert registry.asked["r.io/m:1"] == 1  # remembered: a converged Module asks nothing


async def test_a_black_holed_registry_holds_no_caller_and_at_most_a_few_checks() -> None:
    registry = _Registry()
    checker = existence.Checker(registry, concurrency=2)
    for index in range(5):
        found = checker.fact(_key(f"black.hole/m:{index}"), _Secrets())
        assert found.pending
    await _turns()
    assert registry.in_flight() == 2  # the others wait for a slot, not the caller
    assert checker.running() == 5
    await checker.close()
    assert checker.running() == 0


async def test_a_check_that_never_ends_ends_at_its_budget() -> None:
    registry = _Registry()
    checker = existence.Checker(registry, budget=0.01)
    checker.fact(_key(), _Secrets())
    await checker.settled()
    found = checker.known(_key())
    assert found is not None
    assert (found.state, found.failure, found.undecided) == (
        existence.State.ERROR,
        "Timeout",
        True,
    )
    assert found.retry_at > 0


async def test_a_forgotten_check_never_overwrites_the_newer_answer() -> None:
    registry, requeued = _Registry(), []
    checker = existence.Checker(registry)
    waiter = existence.Waiter(requeued.append, "ns/m")
    checker.fact(_key(), _Secrets(), waiter=waiter)
    await _turns()
    old = registry.waiting["r.io/m:1"][0]
    checker.forget("r.io/m:1")  # e.g. the build pod pushed it meanwhile
    checker.fact(_key(), _Secrets(), waiter=waiter)
    await _turns()
    assert registry.asked["r.io/m:1"] == 2
    await registry.answer("r.io/m:1", existence.State.EXISTS)  # the newer check
    if not old.done():  # the older one, had it not been cancelled
        old.set_result(existence.Fact(existence.State.MISSING))
    await checker.settled()
    found = checker.known(_key())
    assert found is not None
    assert found.state is existence.State.EXISTS
    assert checker.checks == {"Exists": 1}
    assert requeued == ["ns/m"]


async def test_errors_and_anonymous_authentication_failures_are_asked_again_after_a_backoff() -> (
    None
):
    registry = _Registry()
    now = [100.0]
    checker = existence.Checker(registry, clock=lambda: now[0], retry_initial=5.0)
    # Jitter makes the first delay between 2.5 and 5 seconds.
    for state in (existence.State.ERROR, existence.State.AUTH_FAILED):
        image = f"r.io/{state.value.lower()}:1"
        checker.fact(_key(image), _Secrets())
        await _turns()
        await registry.answer(image, state, undecided=state is existence.State.AUTH_FAILED)
        found = checker.known(_key(image))
        assert found is not None
        assert 102.5 <= found.retry_at <= 105.0
        assert checker.fact(_key(image), _Secrets()) == found  # not due: nothing asked
        assert registry.asked[image] == 1
    now[0] += 5.0
    for state in (existence.State.ERROR, existence.State.AUTH_FAILED):
        image = f"r.io/{state.value.lower()}:1"
        shown = checker.fact(_key(image), _Secrets())
        assert (shown.state, shown.pending) == (state, True)  # still shown meanwhile
        await _turns()
        assert registry.asked[image] == 2
        await registry.answer(image, existence.State.EXISTS)
        found = checker.known(_key(image))
        assert found is not None
        assert (found.state, found.retry_at) == (existence.State.EXISTS, 0.0)


async def test_an_authentication_failure_with_a_secret_is_asked_again_once_the_secret_changed() -> (
    None
):
    registry, secrets = _Registry(), _Secrets()
    checker = existence.Checker(registry)
    key = _key(secret="ns/repo")
    checker.fact(key, secrets)
    await _turns()
    await registry.answer(key.image, existence.State.AUTH_FAILED, secret_version="1")
    for _ in range(3):  # the Secret is read, the registry not asked
        found = checker.fact(key, secrets)
        assert found.state is existence.State.AUTH_FAILED
        await checker.settled()
    assert registry.asked[key.image] == 1
    assert secrets.reads == 4
    secrets.version = "2"
    checker.fact(key, secrets)
    await _turns()
    assert registry.asked[key.image] == 2
    await registry.answer(key.image, existence.State.EXISTS)
    found = checker.known(key)
    assert found is not None
    assert found.state is existence.State.EXISTS


async def test_a_missing_image_someone_else_pushes_is_asked_again_every_recheck() -> None:
    registry = _Registry()
    now = [100.0]
    checker = existence.Checker(registry, clock=lambda: now[0])
    checker.fact(_key(), _Secrets(), recheck_missing=10.0)
    await _turns()
    await registry.answer("r.io/m:1", existence.State.MISSING)
    found = checker.known(_key())
    assert found is not None
    assert found.retry_at == 110.0
    now[0] += 9.0
    assert not checker.fact(_key(), _Secrets(), recheck_missing=10.0).pending
    now[0] += 1.0
    assert checker.fact(_key(), _Secrets(), recheck_missing=10.0).pending
    await _turns()
    assert registry.asked["r.io/m:1"] == 2
    await checker.close()


async def test_a_check_that_fails_unexpectedly_is_an_error_fact() -> None:
    async def broken(key: existence.Key, secret: Obj | None) -> existence.Fact:
        raise RuntimeError("a bug")

    checker = existence.Checker(broken)
    checker.fact(_key(), _Secrets())
    await checker.settled()
    found = checker.known(_key())
    assert found is not None
    assert (found.state, found.failure) == (existence.State.ERROR, "CheckFailed")
    assert "a bug" not in found.message


@pytest.mark.parametrize("stop", [False, True])
async def test_run_cancels_the_checks_in_flight_when_it_stops(stop: bool) -> None:
    registry = _Registry()
    checker = existence.Checker(registry)
    stopping = asyncio.Event()
    running = asyncio.ensure_future(checker.run(stopping))
    checker.fact(_key(), _Secrets())
    await _turns()
    assert registry.in_flight() == 1
    if stop:
        stopping.set()
        await running
    else:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert checker.running() == 0
    # A reconcile still finishing starts nothing once stopped.
    assert checker.fact(_key("r.io/late:1"), _Secrets()).pending
    assert checker.running() == 0
    await checker.settled()
    assert registry.asked["r.io/late:1"] == 0


async def test_a_nodes_verdict_replaces_an_undecided_fact_and_is_kept() -> None:
    registry = _Registry()
    checker = existence.Checker(registry)
    key = existence.Key("r.io/m:1", secret="ns/repo")
    requeued: list[str] = []
    waiter = existence.Waiter(requeued.append, "ns/m")
    checker.fact(key, _Secrets(), waiter=waiter)
    await _turns()
    await registry.answer("r.io/m:1", existence.State.ERROR, undecided=True)
    assert checker.known(key) is not None
    checker.fact(key, _Secrets(), waiter=waiter)
    checker.record(key, existence.Fact(existence.State.MISSING, "no such image", node="n1"))
    # Requeued for the answer; the verdict is kept by the reconcile that reads it.
    assert requeued == ["ns/m"]
    for _ in range(3):
        found = checker.fact(key, _Secrets(), waiter=waiter)
    assert (found.state, found.node, found.pending) == (existence.State.MISSING, "n1", False)
    assert registry.asked["r.io/m:1"] == 1  # kept: the registry is not asked again
    # A node's refusal is asked again after the back-off (no Secret probe each reconcile).
    checker.record(key, existence.Fact(existence.State.AUTH_FAILED, "refused", node="n1"))
    refused = checker.known(key)
    assert refused is not None
    assert refused.retry_at > 0
    checker.fact(key, _Secrets(), waiter=waiter)
    assert checker.running() == 0


async def test_a_removal_runs_in_the_background_and_leaves_the_image_known_missing() -> None:
    deleted: list[tuple[str, str]] = []

    async def delete(key: existence.Key, secret: Obj | None, digest: str) -> existence.Deletion:
        deleted.append((key.image, digest))
        return existence.Deletion("deleted")

    checker = existence.Checker(_Registry(), delete=delete)
    key = existence.Key("r.io/m:1-kmm-unsigned")
    requeued: list[str] = []
    assert checker.remove(
        key, "sha256:" + "a" * 64, _Secrets(), waiter=existence.Waiter(requeued.append, "ns/m")
    )
    await checker.settled()
    assert deleted == [("r.io/m:1-kmm-unsigned", "sha256:" + "a" * 64)]
    assert requeued == ["ns/m"]
    assert checker.removal(key) == existence.Deletion("deleted")
    assert checker.removal(key) is None  # told once
    found = checker.known(key)
    assert found is not None
    assert found.state is existence.State.MISSING
    assert not existence.Checker(_Registry()).remove(key, "sha256:" + "a" * 64, _Secrets())
