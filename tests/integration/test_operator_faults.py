"""The operator under what the API server does to it (issue 16), on a sandbox of
this module's own whose API server compacts etcd every second, serves
watches from etcd (no watch cache) and admits one write at a time from
anyone but system:masters:

- a watch expired by compaction (a real 410) is relisted, and nothing that
  changed while the operator was cut off is missed, DRA Modules included;
- throttled (429 with Retry-After) while something else holds the write
  slot part of the time, the operator, impersonating its ServiceAccount,
  backs off and converges with no write lost;
- two replicas, the API server gone for longer than the lease: the leader
  sends no write past its renew deadline, and after the restart exactly
  one replica writes.

Each test makes nodes of its own (``sandbox.nodes``) and deletes them, so
the order of the tests does not matter. The sandbox come from the real
server (``partitioning``, ``throttling``, ``restarting``); the counts come
from the operator's own metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import pytest
import test_operator_dra as dra
import test_operator_support as support
import test_sandbox_faults as sandbox_faults
import test_sandbox_lifecycle as lifecycle
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import counting, errors, reflecting
from kmm.operator import wiring
from kmm.runtime import leaderelection
from kmm.sandbox import cluster, testing
from kmm.sandbox.kwoknodes import nodes

KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")
COMPACTION = sandbox_faults.COMPACTION
SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"
HOLDER = "kmm-test-slot-holder"
SEED = 16


@pytest.fixture(scope="module")
def sandbox() -> Iterator[testing.RunningSandbox]:
    """This module's sandbox, in place of the session's (``api_client`` and
    ``namespace`` from conftest use it)."""
    with lifecycle.own_sandbox("kof", nodes=1, kernels=KERNELS, **sandbox_faults.FAULTS) as own:
        asyncio.run(_install(own.kubeconfig))
        yield own


async def _install(kubeconfig: Path) -> None:
    """The CRD, admission policy, operator namespace and RBAC from deploy/."""
    await support.install_manifests(kubeconfig)
    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    async with cluster.api_client(kubeconfig) as api:
        await applying.apply_documents(api, docs)


@contextlib.asynccontextmanager
async def own_nodes(
    sandbox: testing.RunningSandbox, prefix: str, count: int
) -> AsyncIterator[list[str]]:
    """``count`` fresh KWOK nodes, kernels round robin over KERNELS; deleted after."""
    made = nodes.spread(count, KERNELS, prefix=f"{prefix}-{uuid.uuid4().hex[:4]}")
    names = [name for name, _ in made]
    async with cluster.api_client(sandbox.kubeconfig) as api:
        await nodes.create(api, made)
        await nodes.wait_ready(api, names, timeout=120)
        try:
            yield names
        finally:
            for name in names:
                with contextlib.suppress(errors.NotFound):
                    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def label(api: client.ApiClient, node: str, change: dict[str, str | None]) -> None:
    await client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": change}})


def kernel_of(node: str, names: Sequence[str]) -> str:
    return KERNELS[names.index(node) % len(KERNELS)]


async def loader_images(api: client.ApiClient, namespace: str) -> dict[str, list[str]]:
    """Kernel label -> images of the loader DaemonSets for it (a duplicate shows as two)."""
    found: dict[str, list[str]] = {}
    for daemonset in await support.loader_daemonsets(api, namespace):
        kernel = daemonset.metadata.labels[labels.KERNEL_VERSION_FULL]
        image = daemonset.spec.template.spec.containers[0].image
        found.setdefault(kernel, []).append(image)
    return found


def moved_literal(images: dict[str, list[str]], kernels_: set[str]) -> dict[str, list[str]]:
    """``images`` for ``kernels_``, the literal mapping's image moved to ``example.com/moved``."""
    return {
        kernel: [image.replace("example.com/literal/", "example.com/moved/") for image in found]
        for kernel, found in images.items()
        if kernel in kernels_
    }


def kernel_labels(nodes_: set[str], names: Sequence[str]) -> set[str]:
    return {labels.kernel_value(kernels.node_kernel(kernel_of(n, names))) for n in nodes_}


# -- 410: a watch expired by compaction --------------------------------------


async def _compacted(api: kube_client.Client, version: str) -> bool:
    """Whether etcd no longer has ``version`` (a list at exactly it is 410)."""
    try:
        await api.request(
            "GET",
            "/api/v1/namespaces/default/configmaps",
            query={"resourceVersion": version, "resourceVersionMatch": "Exact", "limit": 1},
        )
    except errors.Gone:
        return True
    return False


async def test_a_watch_expired_by_compaction_is_relisted_and_nothing_missed(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    async with (
        own_nodes(sandbox, "gap", 8) as names,
        sandbox.partition() as partition,
        support.operator_in_process(sandbox.kubeconfig, through=partition) as running,
        cluster.api_client(sandbox.kubeconfig) as admin,
    ):
        n = names
        loader_key, dra_key = f"kmm-test/{namespace}-loader", f"kmm-test/{namespace}-dra"
        for node in (n[0], n[1], n[2], n[3], n[7]):
            await label(api_client, node, {loader_key: "yes"})
        for node in (n[4], n[5], n[6]):
            await label(api_client, node, {dra_key: "yes"})
        await support.create_module(
            api_client, namespace, support.module_body("loader", {loader_key: "yes"})
        )
        await support.create_module(
            api_client, namespace, dra.dra_body("drv", dra_key, namespace, loader=False)
        )
        before = {n[0], n[1], n[2], n[3], n[7]}

        async def first() -> bool:
            return (
                await support.converged(api_client, namespace, "loader", before)
                and await dra.labelled(api_client, labels.dra_target(namespace, "drv"))
                == {n[4], n[5], n[6]}
                and len(await dra.our_classes(api_client, namespace, "drv")) == 2
            )

        await testing.eventually(first, "both Modules converged before the partition")
        images = await loader_images(api_client, namespace)
        assert all(len(found) == 1 for found in images.values())

        partition.cut()
        versions = {i.name: i.resource_version for i in running.op.informers()}
        # While the operator is cut off: nodes leave, join, go; a Module changes.
        await label(api_client, n[0], {loader_key: None})
        await label(api_client, n[4], {loader_key: "yes", dra_key: None})
        await label(api_client, n[3], {dra_key: "yes"})
        await client.CoreV1Api(api_client).patch_node(n[6], {"spec": {"unschedulable": True}})
        await admin.request("DELETE", f"/api/v1/nodes/{n[7]}")
        changed = support.module_body("loader", {loader_key: "yes"})
        mappings = changed["spec"]["moduleLoader"]["container"]["kernelMappings"]
        mappings[0]["containerImage"] = "example.com/moved/kmm-test:${KERNEL_XYZ}"
        await dra.patch_spec(
            api_client,
            namespace,
            "drv",
            {
                "dra": {
                    **dra.dra_spec(namespace),
                    "deviceClasses": [
                        {"name": f"{namespace}-any"},
                        {"name": f"{namespace}-renamed"},
                    ],
                }
            },
        )
        await dra.patch_spec(api_client, namespace, "loader", changed["spec"])
        # A watch from version v asks etcd for the revisions from v + 1 on:
        # it expires once v + 1 is compacted away, for every informer.
        newest = max(int(v) for v in versions.values() if v)
        await testing.eventually(
            lambda: _compacted(admin, str(newest + 1)),
            f"the revision after the operator's newest resourceVersion ({newest}) compacted away",
            interval=COMPACTION,
        )
        partition.heal()

        after = {n[1], n[2], n[3], n[4]}

        async def healed() -> bool:
            module = await support.get_module(api_client, namespace, "loader")
            matching = ((module or {}).get("status") or {}).get("moduleLoader") or {}
            classes = {c.metadata.name for c in await dra.our_classes(api_client, namespace, "drv")}
            return (
                await support.converged(api_client, namespace, "loader", after)
                and matching.get("nodesMatchingSelectorNumber") == len(after)
                and await loader_images(api_client, namespace)
                == moved_literal(images, kernel_labels(after, n))
                and await dra.labelled(api_client, labels.dra_target(namespace, "drv"))
                == {n[3], n[4], n[5]}
                and classes == {f"{namespace}-any", f"{namespace}-renamed"}
                and len(await dra.dra_daemonsets(api_client, namespace)) == 1
            )

        await testing.eventually(healed, "everything changed in the gap seen", bound=180)
        relists = support.metric(running.metrics(), "kmm_informer_relists_total")
        gone = {
            dict(key)["informer"]: value
            for key, value in relists.items()
            if dict(key)["reason"] == reflecting.GONE
        }
        print(f"\nrelists after 410: {sorted(gone.items())}; partition {partition.refused} refused")
        # Every informer's watch came back to a compacted version: each got
        # its 410 from the server and listed again.
        assert set(gone) == set(versions)
        assert all(value >= 1 for value in gone.values())
        await support.delete_and_wait_clean(api_client, namespace, "loader")
        await delete_and_wait_gone(api_client, namespace, "drv")


async def delete_and_wait_gone(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a Module while the operator runs and wait until its finalizer let it go."""
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
    )

    async def gone() -> bool:
        return await support.get_module(api, namespace, name) is None

    await testing.eventually(gone, f"Module {name} deleted")


# -- 429: throttled while something else holds the write slot ---------------


class SlotHolder:
    """Holds the API server's one write slot part of the time, on a seeded
    random schedule: held a while, free a while (``held`` counts the holds)."""

    def __init__(self, sandbox: testing.RunningSandbox, namespace: str) -> None:
        self.sandbox = sandbox
        self.namespace = namespace
        self.random = random.Random(SEED)
        self.held = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            async with self.sandbox.stalled_write(
                self.namespace, user=HOLDER, answer_wait=0.5
            ) as holding:
                if holding:
                    self.held += 1
                    await self._pause(self.random.uniform(0.2, 1.0))
            await self._pause(self.random.uniform(0.5, 1.5))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


@contextlib.asynccontextmanager
async def holding_the_slot(
    sandbox: testing.RunningSandbox, namespace: str
) -> AsyncIterator[SlotHolder]:
    """A ``SlotHolder`` running for the block."""
    async with cluster.api_client(sandbox.kubeconfig) as admin:
        await sandbox_faults.grant_edit(admin, namespace, HOLDER)
    holder = SlotHolder(sandbox, namespace)
    task = asyncio.ensure_future(holder.run())
    try:
        yield holder
    finally:
        holder.stop.set()
        await task


async def test_throttled_the_operator_backs_off_and_loses_no_write(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    election = wiring.Election(identity="throttled", namespace="kmm-system")
    async with (
        own_nodes(sandbox, "thr", 6) as names,
        holding_the_slot(sandbox, namespace) as holder,
        support.operator_in_process(
            sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT, election=election
        ) as running,
    ):
        select = f"kmm-test/{namespace}"
        chosen = set(names[:4])
        for node in chosen:
            await label(api_client, node, {select: "yes"})
        await support.create_module(
            api_client, namespace, support.module_body("throttled", {select: "yes"})
        )

        async def converged(expected: set[str]) -> bool:
            found = await loader_images(api_client, namespace)
            return (
                await support.converged(api_client, namespace, "throttled", expected)
                and set(found) == kernel_labels(expected, names)
                and all(len(images) == 1 for images in found.values())
            )

        await testing.eventually(lambda: converged(chosen), "converged while throttled", bound=240)
        # A second round of changes, still throttled: one node leaves, two join.
        await label(api_client, names[0], {select: None})
        for node in names[4:]:
            await label(api_client, node, {select: "yes"})
        chosen = set(names[1:])
        await testing.eventually(
            lambda: converged(chosen), "converged again while throttled", bound=240
        )
        assert not running.task.done()  # never lost the lease to the throttling
        text = running.metrics()
        throttled = support.metric(text, "kmm_api_throttled_total")
        written = support.metric(text, "kmm_api_writes_total")
        print(
            f"\nthrottled: {holder.held} holds; 429s {sorted((tuple(sorted(k)), v) for k, v in throttled.items())}"
            f"; writes {sum(written.values()):.0f}"
        )
        # The operator's own writes were answered 429 and went again.
        assert sum(value for key, value in throttled.items() if dict(key)["verb"] == "PATCH") > 0
        await support.delete_and_wait_clean(api_client, namespace, "throttled")


# -- two replicas, the API server gone for longer than the lease -------------

# Short, as a user could set them (kmm operator --lease-duration ...), so the
# outage outlasts the lease in seconds.
LEASE = wiring.Election(
    identity="", namespace="kmm-system", lease_duration=4.0, renew_deadline=3.0, retry_period=1.0
)
# Every Module requeued this often: a leader with work to do during the
# outage tries its writes again and again, so one past its deadline would show.
RESYNC = 0.3


class WriteLog(counting.RequestCounter):
    """A request counter that also keeps the wall time of every write attempt,
    and calls ``trip`` (once) when the first node patch is about to be sent."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[tuple[float, str]] = []
        self.trip: Callable[[], None] | None = None

    def record(self, verb: str, path: str) -> None:
        super().record(verb, path)
        if verb not in counting.WRITE_VERBS:
            return
        resource = counting.resource_of(path)
        self.times.append((time.time(), resource))
        if self.trip is not None and resource == "nodes":
            trip, self.trip = self.trip, None
            trip()


class Renewals:
    """The elector's lease client, passed through; keeps every record the
    API server accepted (the Lease as the other replica reads it)."""

    def __init__(self, inner: leaderelection.LeaseClient) -> None:
        self.inner = inner
        self.accepted: list[leaderelection.LeaseRecord] = []

    async def get(self, namespace: str, name: str) -> leaderelection.LeaseRecord | None:
        return await self.inner.get(namespace, name)

    async def create(
        self, namespace: str, name: str, record: leaderelection.LeaseRecord
    ) -> leaderelection.LeaseRecord:
        self.accepted.append(await self.inner.create(namespace, name, record))
        return self.accepted[-1]

    async def update(
        self, namespace: str, name: str, record: leaderelection.LeaseRecord
    ) -> leaderelection.LeaseRecord:
        self.accepted.append(await self.inner.update(namespace, name, record))
        return self.accepted[-1]


def non_lease_writes(running: support.InProcess) -> float:
    """``kmm_api_writes_total`` of a replica, the Lease's own writes left out."""
    written = support.metric(running.metrics(), "kmm_api_writes_total")
    return sum(v for k, v in written.items() if dict(k)["resource"] != "coordination.k8s.io/leases")


async def test_the_leader_stops_writing_before_its_lease_can_be_taken(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, namespace: str
) -> None:
    logs = {"a": WriteLog(), "b": WriteLog(), "a-again": WriteLog()}
    renewals: dict[str, Renewals] = {}

    def replica(identity: str) -> contextlib.AbstractAsyncContextManager[support.InProcess]:
        def prepare(op: wiring.Operator) -> None:
            assert op.elector is not None
            renewals[identity] = Renewals(op.elector.leases)
            op.elector.leases = renewals[identity]

        return support.operator_in_process(
            sandbox.kubeconfig,
            election=dataclasses.replace(LEASE, identity=identity),
            counter=logs[identity],
            prepare=prepare,
            resync_period=RESYNC,
        )

    async with (
        own_nodes(sandbox, "ha", 4) as names,
    ):
        select, select_dra = f"kmm-test/{namespace}", f"kmm-test/{namespace}-dra"
        for node in names:
            await label(api_client, node, {select: "yes"})
        for node in names[2:]:
            await label(api_client, node, {select_dra: "yes"})
        async with replica("a") as a:
            await testing.eventually(now(a.op.leading), "a leads")
            async with replica("b") as b:
                await testing.eventually(b.synced, "b's caches synced")
                assert not b.op.leading()
                crashed: list[float] = []

                def crash() -> None:
                    # The leader is about to send its first node patch: the
                    # API server crashes now, with the leader's work undone.
                    sandbox.kill("kube-apiserver")
                    crashed.append(time.time())

                logs["a"].trip = crash
                # A DRA Module too (issue 16: rerun over the DRA parts).
                await support.create_module(
                    api_client,
                    namespace,
                    dra.dra_body("ha-dra", select_dra, namespace, loader=False),
                )
                await support.create_module(
                    api_client, namespace, support.module_body("ha", {select: "yes"})
                )
                await testing.eventually(now(lambda: bool(crashed)), "the API server crashed")
                await asyncio.wait_for(a.lost_the_lease(), timeout=60)
                last = renewals["a"].accepted[-1]
                assert last.renew_time is not None
                renewed = last.renew_time.timestamp()
                deadline = renewed + LEASE.renew_deadline
                takeable = renewed + LEASE.lease_duration
                # Down for longer than the lease: b could take it the moment
                # the server is back.
                await asyncio.sleep(max(0.0, takeable + 1.0 - time.time()))
                await sandbox.start("kube-apiserver")
                async with replica("a-again") as again:
                    everywhere = set(names)

                    async def converged() -> bool:
                        return (
                            await support.converged(api_client, namespace, "ha", everywhere)
                            and await dra.labelled(
                                api_client, labels.dra_target(namespace, "ha-dra")
                            )
                            == set(names[2:])
                            and len(await dra.our_classes(api_client, namespace, "ha-dra")) == 2
                            and len(await dra.dra_daemonsets(api_client, namespace)) == 1
                        )

                    await testing.eventually(converged, "converged after the outage", bound=180)
                    leaders = [r for r in (b, again) if r.op.leading()]
                    writers = {
                        name: non_lease_writes(r) for name, r in (("b", b), ("a-again", again))
                    }
                    outage = [t for t, _ in logs["a"].times if t >= crashed[0]]
                    late = [t - deadline for t, _ in logs["a"].times if t >= deadline]
                    print(
                        f"\nleader a: last renewal {renewed:.3f}, crash +{crashed[0] - renewed:.3f} s, "
                        f"{len(outage)} write attempts in the outage, the last "
                        f"+{max(outage, default=renewed) - renewed:.3f} s (deadline +{LEASE.renew_deadline} s); "
                        f"after the restart non-lease writes {writers}"
                    )
                    # It kept trying while it held the lease...
                    assert outage
                    # ...and sent nothing once its deadline had passed.
                    assert late == []
                    # Exactly one replica leads and writes after the restart.
                    assert len(leaders) == 1
                    assert sorted(v > 0 for v in writers.values()) == [False, True]
                    assert writers["b" if leaders[0] is b else "a-again"] > 0
                    await support.delete_and_wait_clean(api_client, namespace, "ha")
                    await delete_and_wait_gone(api_client, namespace, "ha-dra")


def now(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``predicate`` as a check ``testing.eventually`` can poll."""

    async def check() -> bool:
        return predicate()

    return check
