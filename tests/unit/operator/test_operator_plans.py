"""Loader plan, device-plugin plan, node label changes, status and cache mappings."""

from __future__ import annotations

import operator_fixtures as fixtures

from kmm.api import conditions, labels
from kmm.operator import caches, deviceplugin, loaderbuilders, moduleloader, nodelabels, status
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


def test_plan_groups_selected_nodes_into_pairs() -> None:
    module = fixtures.module()
    plan = moduleloader.plan(module, _nodes(), [], [])
    assert plan.selected == ["n0", "n1", "n2", "n3", "unknown"]
    assert sorted(plan.grouping.nodes) == ["5.14.0-427.el9.x86_64", "6.1.0-27-amd64", K68]
    assert plan.grouping.untargeted == ["unknown"]
    assert len(plan.to_apply) == 3
    assert plan.to_delete == []
    assert plan.kernel_labels["n2"] == "5.14.0-427.el9.x86_64"
    assert "other" not in plan.kernel_labels
    assert plan.node_pairs["n0"] == plan.node_pairs["n3"]


def test_converged_plan_applies_nothing_and_deletes_stale_pairs() -> None:
    module = fixtures.module()
    first = moduleloader.plan(module, _nodes(), [], [])
    stale = loaderbuilders.daemonset(module, first.grouping.targets[K68])
    stale["metadata"]["name"] = "stray-duplicate"
    existing = [*first.desired.values(), stale]
    again = moduleloader.plan(module, _nodes(), existing, [])
    assert again.to_apply == []
    assert again.to_delete == ["stray-duplicate"]

    fewer = [n for n in _nodes() if n["metadata"]["name"] != "n1"]
    after = moduleloader.plan(module, fewer, list(first.desired.values()), [])
    assert after.to_apply == []
    assert len(after.to_delete) == 1


def test_changed_image_replaces_only_that_pair() -> None:
    raw = fixtures.module_raw()
    first = moduleloader.plan(fixtures.module(raw), _nodes(), [], [])
    raw["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["containerImage"] = "r.io/x:v2"
    second = moduleloader.plan(fixtures.module(raw), _nodes(), list(first.desired.values()), [])
    assert [d["spec"]["template"]["spec"]["containers"][0]["image"] for d in second.to_apply] == [
        "r.io/x:v2"
    ]
    assert len(second.to_delete) == 1


def test_untolerated_taint_excludes_node_unless_loaded_already() -> None:
    module = fixtures.module()
    taint = [{"key": "gpu", "effect": "NoSchedule"}]
    nodes = [fixtures.node("n1", K61, taints=taint)]
    assert moduleloader.plan(module, nodes, [], []).to_apply == []
    ds = moduleloader.plan(module, [fixtures.node("n1", K61)], [], []).to_apply[0]
    kept = moduleloader.plan(module, nodes, [ds], [fixtures.pod(ds, "n1")])
    assert kept.to_delete == []
    assert kept.node_pairs.keys() == {"n1"}


def test_ready_nodes_need_the_pod_of_the_nodes_own_pair() -> None:
    module = fixtures.module()
    plan = moduleloader.plan(module, _nodes(), [], [])
    by_kernel = {
        d["metadata"]["labels"][labels.KERNEL_VERSION_FULL]: d for d in plan.desired.values()
    }
    pods = [
        fixtures.pod(by_kernel[K68], "n0"),
        fixtures.pod(by_kernel[K68], "n3", ready=False),
        fixtures.pod(by_kernel[K68], "n1"),  # wrong pair for n1's kernel
    ]
    assert moduleloader.ready_nodes(plan.node_pairs, pods) == {"n0"}


def test_label_changes_set_and_remove_exactly() -> None:
    nodes = [
        fixtures.node("a", K68, extra={labels.ready("ns", "m"): ""}),
        fixtures.node("b", K68, extra={labels.KERNEL_VERSION_FULL: K68}),
        fixtures.node("c", K68, extra={labels.device_plugin_ready("ns", "m"): ""}),
    ]
    found = nodelabels.changes(
        nodes,
        namespace="ns",
        name="m",
        kernel_labels={"a": K68, "b": K68},
        ready={"b"},
        plugin_ready=set(),
    )
    assert found == {
        "a": {labels.KERNEL_VERSION_FULL: K68, labels.ready("ns", "m"): None},
        "b": {labels.ready("ns", "m"): ""},
        "c": {labels.device_plugin_ready("ns", "m"): None},
    }


def test_device_plugin_plan() -> None:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/p:1"}})
    plan = deviceplugin.plan(fixtures.module(raw), [])
    assert len(plan.to_apply) == 1
    again = deviceplugin.plan(fixtures.module(raw), plan.to_apply)
    assert again.to_apply == []
    gone = deviceplugin.plan(fixtures.module(), plan.to_apply)
    assert gone.to_delete == [plan.to_apply[0]["metadata"]["name"]]


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


def test_module_of_label() -> None:
    assert caches.module_of_label(labels.ready("ns", "a.b")) == "ns/a.b"
    assert caches.module_of_label(labels.device_plugin_ready("ns", "m")) == "ns/m"
    assert caches.module_of_label(labels.KERNEL_VERSION_FULL) is None
    assert caches.module_of_label("example.com/x.ready") is None
