"""Loader plan, device-plugin plan, node label changes, status and cache mappings."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import conditions, labels
from kmm.operator import (
    caches,
    deviceplugin,
    loaderbuilders,
    moduleloader,
    nodelabels,
    plans,
    status,
    views,
)
from kmm.runtime import stores

K68, K61, KEL9 = fixtures.KERNELS


def _nodes() -> list[dict]:
    return [
        fixtures.node("n0", K68),
        fixtures.node("n1", K61),
        fixtures.node("n2", KEL9),
        fixtures.node("n3", K68),
        fixtures.node("other", K68, pick=False),
        fixtures.node("unknown", "4.18.0-1-custom"),
    ]


def view(
    module: Any,
    nodes: list[dict],
    daemonsets: list[dict] | tuple[()] = (),
    pods: list[dict] | tuple[()] = (),
) -> views.ModuleView:
    store = stores.Store()
    for node in nodes:
        store.put(node)
    key = f"{module.metadata.namespace}/{module.metadata.name}"
    labelled = [n for n in nodes if key in caches.node_module_index(n)]
    return views.build(
        fixtures.module_raw(),
        module,
        nodes=store,
        daemonsets=daemonsets,
        pods=pods,
        labelled=labelled,
    )


def _desired(plan: moduleloader.LoaderPlan) -> dict[str, dict]:
    return {d["metadata"]["labels"][labels.KERNEL_VERSION_FULL]: d for d in plan.apply}


def test_plan_groups_selected_nodes_into_pairs() -> None:
    module = fixtures.module()
    plan = moduleloader.plan(view(module, _nodes()))
    assert sorted(plan.grouping.nodes) == ["5.14.0-427.el9.x86_64", "6.1.0-27-amd64", K68]
    assert plan.grouping.untargeted == ["unknown"]
    assert len(plan.apply) == 3
    assert plan.delete == []
    assert plan.labels["n2"][labels.KERNEL_VERSION_FULL] == "5.14.0-427.el9.x86_64"
    assert "other" not in plan.labels
    assert plan.targeted == {"n0", "n1", "n2", "n3"}


def test_converged_plan_applies_nothing_and_deletes_stale_pairs() -> None:
    module = fixtures.module()
    first = moduleloader.plan(view(module, _nodes()))
    stale = loaderbuilders.daemonset(module, first.grouping.targets[K68])
    stale["metadata"]["name"] = "stray-duplicate"
    again = moduleloader.plan(view(module, _nodes(), [*first.apply, stale]))
    assert again.apply == []
    assert again.delete == ["stray-duplicate"]

    fewer = [n for n in _nodes() if n["metadata"]["name"] != "n1"]
    after = moduleloader.plan(view(module, fewer, first.apply))
    assert after.apply == []
    assert len(after.delete) == 1


def test_changed_image_replaces_only_that_pair() -> None:
    raw = fixtures.module_raw()
    first = moduleloader.plan(view(fixtures.module(raw), _nodes()))
    raw["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["containerImage"] = "r.io/x:v2"
    second = moduleloader.plan(view(fixtures.module(raw), _nodes(), first.apply))
    assert [d["spec"]["template"]["spec"]["containers"][0]["image"] for d in second.apply] == [
        "r.io/x:v2"
    ]
    assert len(second.delete) == 1


def test_untolerated_taint_excludes_node_unless_loaded_already() -> None:
    module = fixtures.module()
    taint = [{"key": "gpu", "effect": "NoSchedule"}]
    nodes = [fixtures.node("n1", K61, taints=taint)]
    assert moduleloader.plan(view(module, nodes)).apply == []
    ds = moduleloader.plan(view(module, [fixtures.node("n1", K61)])).apply[0]
    kept = moduleloader.plan(view(module, nodes, [ds], [fixtures.pod(ds, "n1")]))
    assert kept.delete == []
    assert kept.targeted == {"n1"}
    assert kept.loaded == {"n1"}


def test_loaded_needs_the_pod_of_the_nodes_own_pair() -> None:
    module = fixtures.module()
    by_kernel = _desired(moduleloader.plan(view(module, _nodes())))
    pods = [
        fixtures.pod(by_kernel[K68], "n0"),
        fixtures.pod(by_kernel[K68], "n3", ready=False),
        fixtures.pod(by_kernel[K68], "n1"),  # wrong pair for n1's kernel
    ]
    plan = moduleloader.plan(view(module, _nodes(), list(by_kernel.values()), pods))
    assert plan.loaded == {"n0"}
    assert plan.labels["n0"][labels.ready("ns", "m")] == ""
    assert plan.labels["n3"][labels.ready("ns", "m")] is None


def test_merge_sets_and_removes_exactly_what_differs() -> None:
    nodes = {
        "a": fixtures.node("a", K68, extra={labels.ready("ns", "m"): ""}),
        "b": fixtures.node("b", K68, extra={labels.KERNEL_VERSION_FULL: K68}),
        "c": fixtures.node("c", K68, extra={labels.device_plugin_ready("ns", "m"): ""}),
    }
    loader, plugin = plans.Plan(), plans.Plan()
    for name in ("a", "b"):
        loader.want(name, labels.KERNEL_VERSION_FULL, K68)
    for name, value in (("a", None), ("b", ""), ("c", None)):
        loader.want(name, labels.ready("ns", "m"), value)
        plugin.want(name, labels.device_plugin_ready("ns", "m"), None)
    plugin.want("gone", labels.device_plugin_ready("ns", "m"), None)  # not cached: skipped
    assert nodelabels.merge(nodes, [loader, plugin]) == {
        "a": {labels.KERNEL_VERSION_FULL: K68, labels.ready("ns", "m"): None},
        "b": {labels.ready("ns", "m"): ""},
        "c": {labels.device_plugin_ready("ns", "m"): None},
    }
    clash = plans.Plan()
    clash.want("a", labels.ready("ns", "m"), "")
    with pytest.raises(AssertionError, match="two planners"):
        nodelabels.merge(nodes, [loader, clash])


def test_device_plugin_plan() -> None:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/p:1"}})
    loader = moduleloader.LoaderPlan()
    plan = deviceplugin.plan(view(fixtures.module(raw), []), loader)
    assert len(plan.apply) == 1
    again = deviceplugin.plan(view(fixtures.module(raw), [], plan.apply), loader)
    assert again.apply == []
    gone = deviceplugin.plan(view(fixtures.module(), [], plan.apply), loader)
    assert gone.delete == [plan.apply[0]["metadata"]["name"]]


def _seen(**overrides: object) -> status.Observed:
    values: dict = dict(
        selected=3, loader=None, plugin=None, targeted=3, ready=3,
        plugin_wanted=0, plugin_ready=0, mapping_errors={},
    )  # fmt: skip
    values.update(overrides)
    return status.Observed(**values)


def test_status_conditions_and_no_rewrite_when_unchanged() -> None:
    raw = fixtures.module_raw()
    new = status.compute(raw, _seen(ready=1), now="2026-01-01T00:00:00Z")
    found = {c.type: (c.status, c.reason) for c in new.conditions or ()}
    assert found == {
        conditions.DEGRADED: ("False", conditions.REASON_AS_EXPECTED),
        conditions.READY: ("False", conditions.REASON_NODES_NOT_READY),
        conditions.PROGRESSING: ("True", conditions.REASON_ROLLING_OUT),
    }
    raw["status"] = status.patch_body(new)["status"]
    again = status.compute(raw, _seen(ready=1), now="2026-01-01T00:05:00Z")
    assert not status.differs(raw, again)
    done = status.compute(raw, _seen(), now="2026-01-01T00:05:00Z")
    assert status.differs(raw, done)
    ready = next(c for c in done.conditions or () if c.type == conditions.READY)
    assert (ready.status, ready.last_transition_time) == ("True", "2026-01-01T00:05:00Z")


def test_status_degraded_on_mapping_error_and_invalid() -> None:
    raw = fixtures.module_raw()
    new = status.compute(raw, _seen(mapping_errors={"1.2": "too few parts"}), now="t")
    degraded = next(c for c in new.conditions or () if c.type == conditions.DEGRADED)
    assert (degraded.status, degraded.reason) == ("True", conditions.REASON_KERNEL_MAPPING_FAILED)
    refused = status.invalid(raw, "spec.x: bad", now="t")
    assert {c.reason for c in refused.conditions or ()} == {conditions.REASON_INVALID_SPEC}


def test_node_events_map_to_selecting_and_labelled_modules() -> None:
    store = stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index})
    store.put(fixtures.module_raw("a"))
    store.put(fixtures.module_raw("b", selector={"pick": "no"}))
    store.put(fixtures.module_raw("all", selector={}))
    picked = fixtures.node("n", K68)
    assert caches.modules_of_node(picked, store) == ["ns/a", "ns/all"]
    left = fixtures.node("n", K68, pick=False, extra={labels.ready("ns", "b.dotted"): ""})
    assert caches.modules_of_node(left, store) == ["ns/all", "ns/b.dotted"]


def test_node_index_names_modules_from_their_labels() -> None:
    node = fixtures.node(
        "n",
        K68,
        extra={
            labels.ready("ns", "a.b"): "",
            labels.module_version("ns", "u"): "v1",
            labels.device_plugin_version("ns", "p"): "v1",
            labels.KERNEL_VERSION_FULL: K68,
            "example.com/x.ready": "",
        },
    )
    assert set(caches.node_module_index(node)) == {"ns/a.b", "ns/u", "ns/p"}
