"""Lease leader election against a real API server: one leader, and a takeover.

Timings are short (lease 4 s) so the takeover cases finish quickly; waits are
bounded by generous timeouts, never asserted on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from kmm.kube import client as kube_client
from kmm.runtime import leaderelection

pytestmark = pytest.mark.integration

TIMEOUT = 60.0


def make(api: kube_client.Client, namespace: str, identity: str) -> leaderelection.LeaderElector:
    return leaderelection.LeaderElector(
        leaderelection.ApiLeases(api),
        identity,
        namespace=namespace,
        name="kmm-test-lock",
        lease_duration=4.0,
        renew_deadline=3.0,
        retry_period=0.5,
    )


async def eventually(predicate: Callable[[], bool], *, poll: float = 0.05) -> None:
    """Wait for a condition the real cluster brings about; fail after TIMEOUT."""
    for _ in range(int(TIMEOUT / poll)):
        if predicate():
            return
        await asyncio.sleep(poll)
    raise AssertionError(f"condition not reached in {TIMEOUT}s: {predicate}")


class Candidate:
    def __init__(self, elector: leaderelection.LeaderElector) -> None:
        self.elector = elector
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(elector.run(self.stop))

    async def release(self) -> None:
        self.stop.set()
        await self.task

    async def die(self) -> None:
        # A crash: the task ends without releasing; the Lease still names it.
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def candidates(
    api: kube_client.Client, namespace: str
) -> AsyncIterator[tuple[Candidate, Candidate]]:
    a = Candidate(make(api, namespace, "a"))
    b = Candidate(make(api, namespace, "b"))
    try:
        yield a, b
    finally:
        for candidate in (a, b):
            if not candidate.task.done():
                await candidate.release()


async def read_lease(api_client: client.ApiClient, namespace: str) -> client.V1Lease:
    return await client.CoordinationV1Api(api_client).read_namespaced_lease(
        "kmm-test-lock", namespace
    )


async def test_only_one_leads_and_a_released_lease_is_taken_over(
    api_client: client.ApiClient, kmm_api: kube_client.Client, namespace: str
) -> None:
    async with candidates(kmm_api, namespace) as (a, b):
        await eventually(lambda: a.elector.is_leader() or b.elector.is_leader())
        # Give the follower several retry periods to (wrongly) grab the lease too.
        await asyncio.sleep(2.0)
        assert a.elector.is_leader() != b.elector.is_leader()
        leader, follower = (a, b) if a.elector.is_leader() else (b, a)
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == leader.elector.identity
        assert lease.spec.lease_duration_seconds == 4
        assert lease.spec.lease_transitions == 0

        await leader.release()
        await eventually(follower.elector.is_leader)
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == follower.elector.identity
        assert lease.spec.lease_transitions == 1


async def test_the_follower_takes_over_when_the_leader_dies(
    api_client: client.ApiClient, kmm_api: kube_client.Client, namespace: str
) -> None:
    async with candidates(kmm_api, namespace) as (a, b):
        await eventually(lambda: a.elector.is_leader() or b.elector.is_leader())
        leader, follower = (a, b) if a.elector.is_leader() else (b, a)
        await leader.die()
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == leader.elector.identity
        await eventually(follower.elector.is_leader)
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == follower.elector.identity
        assert lease.spec.lease_transitions == 1
