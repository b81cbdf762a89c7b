"""What a loader pod reported, back to the Module: ``loader.reports``, the
planner's ``failed`` nodes (which get no ``.ready``), the cache keeping the
termination messages, and the reconciler's Degraded ``ModuleLoadFailed``."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import conditions, labels
from kmm.operator import caches, failures, reconciler, views
from kmm.operator.loader import planner as loader_planner
from kmm.operator.loader import reports as loader_reports
from kmm.runtime import stores

K68, K61, _ = fixtures.KERNELS
REFUSED = (
    "modprobe -v -d /opt kmod_x a=1: insmod /opt/lib/modules/6.1.0-27-amd64/extra/kmod_x.ko a=1\n"
    "modprobe: ERROR: could not insert 'kmod_x': Key was rejected by service\n"
)


def _failed(pod: dict[str, Any], message: str, *, part: str = "lastState") -> dict[str, Any]:
    """``pod`` not Ready, its loader container down after a failed hook, as
    the kubelet shows it (``state`` while down, ``lastState`` once restarted)."""
    pod = {**pod, "status": {**pod["status"]}}
    pod["status"]["conditions"] = [
        {"type": "Ready", "status": "False"},
        {"type": "ContainersReady", "status": "False"},
    ]
    terminated = {"exitCode": 0, "reason": "Completed", "message": message}
    status: dict[str, Any] = {"name": "module-loader", "ready": False, "restartCount": 1}
    if part == "state":
        status["state"] = {"terminated": terminated}
    else:
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
        status["lastState"] = {"terminated": terminated}
    pod["status"]["containerStatuses"] = [status]
    return pod


def _daemonsets(module: Any, nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    plan = loader_planner.plan(fixtures.view(module, nodes))
    return {ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL]: ds for ds in plan.apply}


@pytest.mark.parametrize("part", ["state", "lastState"])
def test_a_pod_that_did_not_load_reports_its_termination_message(part: str) -> None:
    module = fixtures.module()
    ds = _daemonsets(module, [fixtures.node("n1", K61)])[K61]
    pod = _failed(fixtures.pod(ds, "n1", ready=False), REFUSED, part=part)
    assert loader_reports.report(pod) == REFUSED.strip()


def test_a_loaded_or_leaving_pod_reports_nothing() -> None:
    module = fixtures.module()
    ds = _daemonsets(module, [fixtures.node("n1", K61)])[K61]
    failed = _failed(fixtures.pod(ds, "n1", ready=False), REFUSED)
    # Loaded on a later attempt: the message is history.
    loaded = {**failed, "status": {**failed["status"], "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    assert loader_reports.report(loaded) is None
    unreported = {**failed, "status": {**failed["status"], "conditions": [{"type": "ContainersReady", "status": "True"}]}}  # fmt: skip
    assert loader_reports.report(unreported) is None
    leaving = {**failed, "metadata": {**failed["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}  # fmt: skip
    assert loader_reports.report(leaving) is None
    assert loader_reports.report(fixtures.pod(ds, "n1", ready=False)) is None


def test_the_problem_names_nodes_module_and_the_kernels_answer() -> None:
    problem = loader_reports.problem(
        "kmod_x", {"n1": REFUSED, "n2": REFUSED, "n3": "other\n", "n4": REFUSED, "n5": REFUSED}
    )
    assert problem is not None
    assert problem.reason == conditions.REASON_MODULE_LOAD_FAILED == "ModuleLoadFailed"
    assert problem.message == (
        "module kmod_x did not load on nodes n1, n2, n4 and 1 more: modprobe -v -d /opt kmod_x "
        "a=1: insmod /opt/lib/modules/6.1.0-27-amd64/extra/kmod_x.ko a=1; modprobe: ERROR: "
        "could not insert 'kmod_x': Key was rejected by service; "
        "module kmod_x did not load on node n3: other"
    )
    assert loader_reports.problem("kmod_x", {}) is None
    raw = loader_reports.problem(None, {"n1": "x"})
    assert raw is not None
    assert raw.message == "the module (rawArgs.load) did not load on node n1: x"
    long = loader_reports.problem("kmod_x", {"n1": "y" * 2000})
    assert long is not None
    assert len(long.message) == failures.MAX_MESSAGE


def test_the_planner_gives_no_ready_label_where_the_load_failed() -> None:
    module = fixtures.module()
    nodes = [fixtures.node("n0", K68), fixtures.node("n1", K61)]
    found = _daemonsets(module, nodes)
    pods = [
        fixtures.pod(found[K68], "n0"),
        _failed(fixtures.pod(found[K61], "n1", ready=False), REFUSED),
    ]
    plan = loader_planner.plan(fixtures.view(module, nodes, list(found.values()), pods))
    assert plan.loaded == {"n0"}
    assert plan.failed == {"n1": REFUSED.strip()}
    ready = labels.ready("ns", "m")
    assert plan.labels["n0"][ready] == ""
    assert plan.labels["n1"][ready] is None


def test_a_pod_of_another_pair_is_not_the_nodes_failure() -> None:
    """The node's kernel changed: the old kernel's pod leaving it, failing,
    is not why the module did not load there."""
    module = fixtures.module()
    old = _daemonsets(module, [fixtures.node("n1", K68)])[K68]
    nodes = [fixtures.node("n1", K61)]
    current = _daemonsets(module, nodes)[K61]
    pods = [_failed(fixtures.pod(old, "n1", ready=False), "old kernel's unload failed")]
    plan = loader_planner.plan(fixtures.view(module, nodes, [current, old], pods))
    assert plan.failed == {}


def test_with_a_version_only_the_version_the_node_runs_reports() -> None:
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["version"] = "v2"
    module = fixtures.module(raw)
    loader_label = labels.module_loader_version("ns", "m")
    nodes = [fixtures.node("n1", K61, extra={loader_label: "v2"})]
    ds = _daemonsets(module, nodes)[K61]
    pods = [_failed(fixtures.pod(ds, "n1", ready=False), REFUSED)]
    plan = loader_planner.plan(fixtures.view(module, nodes, [ds], pods))
    assert plan.failed == {"n1": REFUSED.strip()}
    moved = [fixtures.node("n1", K61, extra={loader_label: "v3"})]
    assert loader_planner.plan(fixtures.view(module, moved, [ds], pods)).failed == {}


def test_the_cache_keeps_only_the_termination_messages_of_loader_pods() -> None:
    module = fixtures.module()
    ds = _daemonsets(module, [fixtures.node("n1", K61)])[K61]
    pod = _failed(fixtures.pod(ds, "n1", ready=False), REFUSED)
    pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] = "back-off 10s"
    kept = caches.project_pod(pod)
    assert kept["status"]["containerStatuses"] == [
        {"name": "module-loader", "lastState": {"terminated": {"message": REFUSED}}}
    ]
    assert loader_reports.report(kept) == REFUSED.strip()
    healthy = caches.project_pod(fixtures.pod(ds, "n1"))
    assert "containerStatuses" not in healthy["status"]
    plugin = {**pod, "metadata": {**pod["metadata"], "labels": {labels.ROLE: "device-plugin"}}}
    assert "containerStatuses" not in caches.project_pod(plugin)["status"]


async def test_the_module_is_degraded_naming_the_node_module_and_answer() -> None:
    cached = views.Caches(
        modules=stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index}),
        daemonsets=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        pods=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
    )
    cached.nodes.put(fixtures.node("n0", K68))
    cached.nodes.put(fixtures.node("n1", K61))
    writes: list[tuple[str, Any]] = []

    class Writer:
        async def apply_daemonset(self, desired: dict[str, Any], observed: Any) -> bool:
            uid = f"uid-ds-{desired['metadata']['name']}"
            cached.daemonsets.put({**desired, "metadata": {**desired["metadata"], "uid": uid}})
            return observed is None

        async def patch_node_labels(self, node: dict[str, Any], change: dict[str, Any]) -> bool:
            writes.append(("labels", (node["metadata"]["name"], change)))
            current = {**node["metadata"].get("labels", {}), **change}
            metadata = {**node["metadata"], "labels": {k: v for k, v in current.items() if v is not None}}  # fmt: skip
            cached.nodes.put({**node, "metadata": metadata})
            return True

        async def patch_module_status(self, module: dict[str, Any], patch: dict[str, Any]) -> bool:
            cached.modules.put({**module, "status": patch["status"]})
            return True

        async def set_finalizers(self, module: dict[str, Any], finalizers: list[str]) -> None:
            pass

        async def create_event(self, event: dict[str, Any]) -> None:
            writes.append(("event", event["reason"]))

    rec = reconciler.ModuleReconciler(cached, Writer(), now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    cached.modules.put(fixtures.module_raw())
    await rec.reconcile("ns/m")
    for ds in cached.daemonsets.objects():
        if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68:
            cached.pods.put(fixtures.pod(ds, "n0"))
        else:
            cached.pods.put(_failed(fixtures.pod(ds, "n1", ready=False), REFUSED))
    await rec.reconcile("ns/m")
    module = cached.modules.get("ns/m")
    assert module is not None
    found = {c["type"]: c for c in module["status"]["conditions"]}
    assert found["Degraded"]["status"] == "True"
    assert found["Degraded"]["reason"] == "ModuleLoadFailed"
    message = found["Degraded"]["message"]
    assert message.startswith("module kmod_x did not load on node n1: ")
    assert "Key was rejected by service" in message
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "ModuleLoadFailed")
    ready = labels.ready("ns", "m")
    labelled = {n["metadata"]["name"] for n in cached.nodes.objects() if ready in n["metadata"]["labels"]}  # fmt: skip
    assert labelled == {"n0"}
    # The retried hook loads: Degraded clears, n1 gets its label.
    for pod in cached.pods.objects():
        if pod["spec"]["nodeName"] == "n1":
            pod = {**pod, "status": {**pod["status"], "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
            cached.pods.put(pod)
    await rec.reconcile("ns/m")
    module = cached.modules.get("ns/m")
    assert module is not None
    found = {c["type"]: c for c in module["status"]["conditions"]}
    assert (found["Degraded"]["status"], found["Degraded"]["reason"]) == ("False", "AsExpected")
    labelled = {n["metadata"]["name"] for n in cached.nodes.objects() if ready in n["metadata"]["labels"]}  # fmt: skip
    assert labelled == {"n0", "n1"}
