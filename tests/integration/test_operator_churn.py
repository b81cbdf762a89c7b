"""Churn (issue 16): 150 changes from a fixed seed, about a minute: KWOK
nodes are added, deleted, relabelled, cordoned, tainted and rebooted into
other kernels while Modules are created, changed and deleted
(``churning``), the operator running. Once things settle, the cluster must
equal what the spec says for its final objects (``expectations``, a model
that never calls the operator): the loader and device-plugin DaemonSets, no
orphan and no duplicate, every node's labels, where the pods run, each
Module's status. Then a resync of the settled cluster writes nothing, and
deleting every Module leaves nothing of them. The operator's writes per
change are printed (``-s``).

On a sandbox of its own, started empty (the churn makes its nodes). A fixed
number of changes, not a fixed time, so the seed fixes the final objects on
any machine; to try another seed, change ``SEED``.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Iterator
from typing import Any

import churning
import expectations
import pytest
import test_operator_support as support
import test_sandbox_lifecycle as lifecycle
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.sandbox import testing

# Seed 3 ends with nodes no Module selects that rebooted after leaving a
# selector (the stale kernel label bug), and switches device plugins on and off.
SEED = 3
CHANGES = 150
NODES = 40
MODULES = 3


@pytest.fixture(scope="module")
def churned() -> Iterator[testing.RunningSandbox]:
    with lifecycle.own_sandbox("kn", nodes=0, kernels=churning.KERNELS[:1]) as sandbox:
        asyncio.run(support.install_manifests(sandbox.kubeconfig))
        yield sandbox


async def _items(call: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """A list call's items as the API server sent them (camelCase dicts)."""
    response = await call(*args, _preload_content=False, **kwargs)
    try:
        found: list[dict[str, Any]] = json.loads(await response.read())["items"]
    finally:
        response.release()
    return found


async def snapshot(api: client.ApiClient, namespace: str) -> expectations.Snapshot:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    found_modules = await custom.list_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL
    )
    return expectations.Snapshot(
        namespace=namespace,
        modules=found_modules["items"],
        nodes=await _items(core.list_node),
        daemonsets=await _items(client.AppsV1Api(api).list_namespaced_daemon_set, namespace),
        pods=await _items(core.list_namespaced_pod, namespace, label_selector=labels.ROLE),
    )


async def settle(api: client.ApiClient, namespace: str, what: str, *, bound: float) -> None:
    """Wait until the cluster equals the model of its own objects; on a
    timeout, fail with what still differed."""
    left: list[tuple[str, str]] = []

    async def right() -> bool:
        nonlocal left
        found = await snapshot(api, namespace)
        left = expectations.differences(found, expectations.expect(found))
        return not left

    try:
        await testing.eventually(right, what, bound=bound, interval=1.0)
    except AssertionError as err:
        shown = "\n".join(f"  {node or '-'}: {text}" for node, text in left[:40])
        raise AssertionError(f"{err}; {len(left)} differences:\n{shown}") from None


async def test_after_churn_the_cluster_is_what_the_spec_says(
    churned: testing.RunningSandbox,
) -> None:
    checker = await support.independent_client(churned.kubeconfig)
    async with (
        checker,
        support.own_namespace(checker, "churn") as namespace,
        support.operator_in_process(churned.kubeconfig) as operator,
    ):
        churn = churning.Churn(checker, churning.Settings(seed=SEED, namespace=namespace))
        await churn.populate(NODES, MODULES)
        await settle(checker, namespace, "the starting cluster", bound=180)
        await operator.wait_idle("the starting cluster settled")
        before = collections.Counter(operator.counter.writes)

        started = asyncio.get_running_loop().time()
        changes = await churn.run(CHANGES)
        took = asyncio.get_running_loop().time() - started
        await settle(checker, namespace, f"after {len(changes)} changes", bound=240)
        await operator.wait_idle("settled after the churn")
        writes = collections.Counter(operator.counter.writes) - before
        total = sum(writes.values())
        kinds = collections.Counter(c.kind for c in changes)
        print(f"\nchurn (seed {SEED}): {len(changes)} changes in {took:.0f} s {dict(kinds)}")
        print(f"  final: {len(churn.nodes)} nodes, {len(churn.modules)} Modules")
        print(f"  operator writes {total}, {total / len(changes):.2f} per change:")
        for (verb, resource), count in sorted(writes.items()):
            print(f"    {verb:6} {resource:34} {count}")
        assert kinds.keys() == churning.KINDS, "the seed must draw every kind of change"

        # Settled means settled: every Module reconciled again writes nothing.
        idle = operator.counter.total_writes
        operator.op.resync()
        await operator.wait_idle("a resync of the settled cluster")
        assert operator.counter.total_writes == idle

        # Nothing is left of a deleted Module.
        for name in sorted(churn.modules):
            await client.CustomObjectsApi(checker).delete_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
            )
        await settle(checker, namespace, "every Module deleted", bound=180)
