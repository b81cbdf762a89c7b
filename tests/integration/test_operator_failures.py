"""A reconcile that keeps failing shows on the Module, on the sandbox.

Two faults: the module loader's planner made to raise for one Module (the
function the reconciler calls, replaced for the test): Degraded
``ReconcileFailed``; and a DaemonSet the operator builds that the real API
server refuses: Degraded ``DaemonSetRefused`` while the rest of the Module
goes ahead (more refusals in test_operator_refusals). Each names what
failed in exactly one Warning Event however often the key is retried, and
the Module converges once the fault is gone. Retries are counted, not
waited for: a wrapper around the operator's reconciler counts the
reconciles of the key that raised, or asked to be retried.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import conditions, labels, modules
from kmm.operator import views, wiring
from kmm.operator.loader import planner as loader_planner
from kmm.runtime import controllers
from kmm.sandbox import testing

manifests = support.manifests

Obj = dict[str, Any]


class CountingFailures:
    """Wraps the operator's reconciler; counts, per key, the reconciles that raised."""

    def __init__(self, inner: controllers.Reconciler) -> None:
        self.inner = inner
        self.raised: collections.Counter[str] = collections.Counter()

    async def reconcile(self, key: str) -> controllers.Result:
        try:
            return await self.inner.reconcile(key)
        except Exception:
            self.raised[key] += 1
            raise

    @classmethod
    def install(cls, op: wiring.Operator) -> CountingFailures:
        wrapper = cls(op.counting.inner)
        op.counting.inner = wrapper
        return wrapper


async def _warnings(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    """The Warning Events ``ReconcileFailed`` about the Module ``name``."""
    listing = await client.CoreV1Api(api).list_namespaced_event(namespace)
    return [
        e
        for e in listing.items
        if e.reason == conditions.REASON_RECONCILE_FAILED
        and e.type == "Warning"
        and e.involved_object.kind == modules.KIND
        and e.involved_object.name == name
    ]


async def _degraded(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    return support.condition(await support.get_module(api, namespace, name), "Degraded")


async def test_a_raising_planner_degrades_its_module_once_and_it_converges_after(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "failing"
    select = f"kmm-test/{namespace}"
    node = sandbox.node_names[0]
    real = loader_planner.plan
    armed = True

    def planner(view: views.ModuleView, **options: Any) -> loader_planner.LoaderPlan:
        # Only this test's Module: another test's operator shares nothing
        # with this one, but the function is the process's. The options
        # (what gates and pins the plan) go through as the reconciler gave them.
        if armed and (view.namespace, view.name) == (namespace, name):
            raise RuntimeError("injected planner failure")
        return real(view, **options)

    monkeypatch.setattr(loader_planner, "plan", planner)
    counted: list[CountingFailures] = []
    async with (
        support.selecting(api_client, [node], select),
        support.operator_in_process(
            sandbox.kubeconfig, prepare=lambda op: counted.append(CountingFailures.install(op))
        ) as running,
    ):
        failures = counted[0]
        await support.create_module(
            api_client, namespace, support.module_body(name, {select: "yes"})
        )
        message = "planning the module loader: RuntimeError: injected planner failure"

        async def shown() -> bool:
            degraded = await _degraded(api_client, namespace, name)
            return (
                degraded is not None
                and degraded["status"] == "True"
                and degraded["reason"] == conditions.REASON_RECONCILE_FAILED
                and degraded["message"] == message
            )

        await testing.eventually(shown, "Degraded naming the failed planner")
        # One key is reconciled by one worker at a time: once the fourth
        # failure is counted, the three before it have written all they
        # were going to write, their Events included.
        key = f"{namespace}/{name}"
        await testing.eventually(
            lambda: _true(failures.raised[key] >= 4), "the failing key retried"
        )
        warnings = await _warnings(api_client, namespace, name)
        assert [(w.message, w.count) for w in warnings] == [(message, 1)]
        assert await support.loader_daemonsets(api_client, namespace) == []

        armed = False
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, {node}),
            "converged once the planner works",
        )
        await running.wait_idle("converged")
        degraded = await _degraded(api_client, namespace, name)
        assert degraded is not None
        assert (degraded["status"], degraded["reason"]) == ("False", conditions.REASON_AS_EXPECTED)
        assert len(await _warnings(api_client, namespace, name)) == 1
        await support.delete_and_wait_clean(api_client, namespace, name)


async def _true(value: bool) -> bool:
    return value


async def test_a_daemonset_the_api_server_refuses_degrades_the_module_and_the_rest_goes(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """A device-plugin container whose ``resources`` (passed to the pod as
    written, left to the API server) the API server refuses. The refusal is
    the Module's ``DaemonSetRefused``, not the reconcile's end: the loader
    runs and the node says loaded meanwhile; the key is retried with backoff
    (no reconcile raises) and told in one Warning Event; once fixed, the
    device plugin runs."""
    name = "refused"
    select = f"kmm-test/{namespace}"
    node = sandbox.node_names[0]
    plugin: Obj = {
        "container": {"image": "example.com/plugin:1", "resources": {"limits": {"cpu": "lots"}}}
    }
    counted: list[CountingRequeues] = []
    async with (
        support.selecting(api_client, [node], select),
        support.operator_in_process(
            sandbox.kubeconfig, prepare=lambda op: counted.append(CountingRequeues.install(op))
        ),
    ):
        requeues = counted[0]
        await support.create_module(
            api_client, namespace, support.module_body(name, {select: "yes"}, devicePlugin=plugin)
        )

        async def shown() -> bool:
            degraded = await _degraded(api_client, namespace, name)
            return degraded is not None and degraded["status"] == "True"

        await testing.eventually(shown, "Degraded naming the refused DaemonSet")
        degraded = await _degraded(api_client, namespace, name)
        assert degraded is not None
        assert degraded["reason"] == conditions.REASON_DAEMONSET_REFUSED
        assert degraded["message"].startswith(
            f"the API server refused DaemonSet {name}-device-plugin"
        )
        # Its own error (500): the apply cannot convert the quantity.
        assert "quantities must match the regular expression" in degraded["message"]
        key = f"{namespace}/{name}"
        await testing.eventually(
            lambda: _true(requeues.requeued[key] >= 4), "the refused key retried"
        )
        assert requeues.raised[key] == 0
        # The rest went ahead: the loader's pod runs, the node says loaded.
        ready = labels.ready(namespace, name)
        await testing.eventually(
            lambda: _loaded(api_client, node, ready), "the module loaded meanwhile"
        )
        warnings = await _refusals(api_client, namespace, name)
        assert [w.message for w in warnings] == [degraded["message"]]

        # Fixed: the next reconcile sends a DaemonSet the API server takes.
        await client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            namespace,
            modules.PLURAL,
            name,
            {"spec": {"devicePlugin": {"container": {"resources": None}}}},
            _content_type="application/merge-patch+json",
        )
        plugin_key = labels.device_plugin_ready(namespace, name)

        async def converged() -> bool:
            if not await support.converged(api_client, namespace, name, {node}):
                return False
            degraded = await _degraded(api_client, namespace, name)
            nodes = await support.node_labels(api_client)
            return (
                degraded is not None and degraded["status"] == "False" and plugin_key in nodes[node]
            )

        await testing.eventually(converged, "module and device plugin ready once fixed")
        assert len(await _refusals(api_client, namespace, name)) == 1
        await support.delete_and_wait_clean(api_client, namespace, name)


class CountingRequeues(CountingFailures):
    """Also counts, per key, the reconciles that asked to be retried with backoff."""

    def __init__(self, inner: controllers.Reconciler) -> None:
        super().__init__(inner)
        self.requeued: collections.Counter[str] = collections.Counter()

    async def reconcile(self, key: str) -> controllers.Result:
        result = await super().reconcile(key)
        if result.requeue:
            self.requeued[key] += 1
        return result


async def _loaded(api: client.ApiClient, node: str, ready: str) -> bool:
    return ready in (await support.node_labels(api))[node]


async def _refusals(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    listing = await client.CoreV1Api(api).list_namespaced_event(namespace)
    return [
        e
        for e in listing.items
        if e.reason == conditions.REASON_DAEMONSET_REFUSED
        and e.type == "Warning"
        and e.involved_object.name == name
    ]
