"""Node label changes, status and cache mappings (shared by every concern)."""

from __future__ import annotations

import operator_fixtures as fixtures
import pytest

from kmm.api import conditions, labels
from kmm.operator import caches, nodelabels, plans, status
from kmm.runtime import stores

K68, K61, KEL9 = fixtures.KERNELS


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
