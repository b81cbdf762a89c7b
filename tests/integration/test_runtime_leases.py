"""Lease leader election against a real API server: one leader, and a takeover.

Timings are short (lease 4 s) so the takeover cases finish quickly; waits are
bounded by generous timeouts, never asserted on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from kmm.kube import client as kube_client
from kmm.runtime import leaderelection
from kmm.sandbox import cluster, testing

pytestmark = pytest.mark.integration

TIMEOUT = 60.0
LEASE_DURATION = 4.0
RETRY_PERIOD = 0.5
LEASES = "coordination.k8s.io/leases"


def make(api: kube_client.Client, namespace: str, identity: str) -> leaderelection.LeaderElector:
    return leaderelection.LeaderElector(
        leaderelection.ApiLeases(api),
        identity,
        namespace=namespace,
        name="kmm-test-lock",
        lease_duration=LEASE_DURATION,
        renew_deadline=3.0,
        retry_period=RETRY_PERIOD,
    )


async def eventually(predicate: Callable[[], bool], *, poll: float = 0.05) -> None:
    """Wait for a condition the real cluster brings about; fail after TIMEOUT."""
    for _ in range(int(TIMEOUT / poll)):
        if predicate():
            return
        await asyncio.sleep(poll)
    raise AssertionError(f"condition not reached in {TIMEOUT}s: {predicate}")


class Candidate:
    def __init__(self, elector: leaderelection.LeaderElector, api: kube_client.Client) -> None:
        self.elector = elector
        self.api = api  # its own: its requests are its attempts
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(elector.run(self.stop))

    def reads(self) -> int:
        """Lease reads sent: one per attempt to acquire or renew."""
        return self.api.counter.requests[("GET", LEASES)]

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
    sandbox: testing.RunningSandbox, namespace: str
) -> AsyncIterator[tuple[Candidate, Candidate]]:
    async with (
        cluster.api_client(sandbox.kubeconfig) as api_a,
        cluster.api_client(sandbox.kubeconfig) as api_b,
    ):
        a = Candidate(make(api_a, namespace, "a"), api_a)
        b = Candidate(make(api_b, namespace, "b"), api_b)
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
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    async with candidates(sandbox, namespace) as (a, b):
        await eventually(lambda: a.elector.is_leader() or b.elector.is_leader())
        leader, follower = (a, b) if a.elector.is_leader() else (b, a)
        # The follower's attempts are at least a retry period apart on its
        # clock: after this many, more than a lease duration has passed since
        # the first found the lease held, so a follower that took a held lease,
        # or missed the leader's renewals, would have taken it by the last.
        # (A read is sent once the attempt before it is decided.)
        attempts = math.ceil(LEASE_DURATION / RETRY_PERIOD) + 2
        first = follower.reads()
        await eventually(lambda: follower.reads() > first + attempts)
        assert leader.elector.is_leader()
        assert not follower.elector.is_leader()
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
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    async with candidates(sandbox, namespace) as (a, b):
        await eventually(lambda: a.elector.is_leader() or b.elector.is_leader())
        leader, follower = (a, b) if a.elector.is_leader() else (b, a)
        await leader.die()
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == leader.elector.identity
        await eventually(follower.elector.is_leader)
        lease = await read_lease(api_client, namespace)
        assert lease.spec.holder_identity == follower.elector.identity
        assert lease.spec.lease_transitions == 1
