"""Level-based healing on the sandbox: events lost to failing handlers are
made good by the periodic resync, and every lost one is counted.

The fault is injected through ``wiring.Operator``'s ``wrap_handler`` seam
(the operator's own handlers, made to raise while the test says so); the
API server, the DaemonSet controller and KWOK are the real ones.
"""

from __future__ import annotations

import collections
import re

import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import modules
from kmm.kube import counting
from kmm.operator import metrics
from kmm.runtime import informers, stores
from kmm.sandbox import testing

manifests = support.manifests

# Short, so the test waits a few seconds for the heal, not the default 10 minutes.
RESYNC_PERIOD = 2.0


class Failing:
    """Wraps the operator's enqueueing handlers; while ``armed`` every call
    raises (the event never reaches the queue) and is counted here."""

    def __init__(self) -> None:
        self.armed = False
        self.raised: collections.Counter[tuple[str, str]] = collections.Counter()

    def wrap(self, informer: str, handler: informers.Handler) -> informers.Handler:
        def call(method: str, *objs: stores.RawObject) -> None:
            if self.armed:
                self.raised[(informer, method)] += 1
                raise RuntimeError(f"injected failure of {informer} {method}")
            getattr(handler, method)(*objs)

        return informers.FuncHandler(
            add=lambda obj: call("on_add", obj),
            update=lambda old, new: call("on_update", old, new),
            delete=lambda obj: call("on_delete", obj),
        )


def _counted(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for match in re.finditer(
        r'^kmm_handler_errors_total\{informer="([^"]+)",method="([^"]+)"\} (\S+)$', text, re.M
    ):
        found[(match.group(1), match.group(2))] = float(match.group(3))
    return found


async def test_events_lost_to_failing_handlers_are_healed_by_the_resync(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "healed"
    select = f"kmm-test/{namespace}"
    # Two nodes of different kernels: healing needs a new DaemonSet, not
    # only a pod the DaemonSet controller would make without us.
    first, second = sandbox.node_names[0], sandbox.node_names[1]
    failing = Failing()
    registry = metrics.OperatorMetrics(counting.RequestCounter(), leading=lambda: True, cached=dict)
    async with (
        support.selecting(api_client, [first], select),
        support.operator_in_process(
            sandbox.kubeconfig,
            resync_period=RESYNC_PERIOD,
            handler_errors=registry,
            wrap_handler=failing.wrap,
        ) as running,
    ):
        await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            namespace,
            modules.PLURAL,
            support.module_body(name, {select: "yes"}),
        )
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, {first}), "loaded on one node"
        )
        await running.wait_idle("converged on one node")
        assert _counted(registry.render().decode()) == {}
        # From here no event of any informer reaches the queue: only the
        # resync can make the operator look at the Module again.
        failing.armed = True
        resyncs = running.op.resyncer.resyncs
        async with support.selecting(api_client, [second], select):
            await testing.eventually(
                lambda: support.converged(api_client, namespace, name, {first, second}),
                "healed: loaded on the second node too",
            )
            failing.armed = False
            assert failing.raised[("nodes", "on_update")] >= 1  # the relabel itself was lost
            assert running.op.resyncer.resyncs > resyncs
            # Every failure was counted, under its informer and method.
            assert _counted(registry.render().decode()) == {
                key: float(count) for key, count in failing.raised.items()
            }
            assert len(await support.loader_daemonsets(api_client, namespace)) == 2
            await support.delete_and_wait_clean(api_client, namespace, name)
