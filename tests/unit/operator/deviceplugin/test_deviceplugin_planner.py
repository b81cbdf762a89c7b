"""The device-plugin planner: its DaemonSet sent, kept, and deleted with the field."""

from __future__ import annotations

import operator_fixtures as fixtures

from kmm.operator.deviceplugin import planner as deviceplugin_planner
from kmm.operator.loader import planner as loader_planner


def test_device_plugin_plan() -> None:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/p:1"}})
    loader = loader_planner.LoaderPlan()
    plan = deviceplugin_planner.plan(fixtures.view(fixtures.module(raw), []), loader)
    assert len(plan.apply) == 1
    again = deviceplugin_planner.plan(fixtures.view(fixtures.module(raw), [], plan.apply), loader)
    assert again.apply == []
    gone = deviceplugin_planner.plan(fixtures.view(fixtures.module(), [], plan.apply), loader)
    assert gone.delete == [plan.apply[0]["metadata"]["name"]]


def test_a_device_plugin_pod_from_an_earlier_boot_of_its_node_is_not_ready() -> None:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/p:1"}})
    module = fixtures.module(raw)
    nodes = [fixtures.node("n0", fixtures.KERNELS[0])]
    (ds,) = deviceplugin_planner.plan(
        fixtures.view(module, nodes), loader_planner.LoaderPlan()
    ).apply
    pod = fixtures.pod(ds, "n0", started="2026-01-01T00:00:00Z")
    loaded = loader_planner.LoaderPlan(loaded={"n0"})
    fresh = deviceplugin_planner.plan(fixtures.view(module, nodes, [ds], [pod]), loaded)
    assert fresh.ready == {"n0"}
    stale = fixtures.view(module, nodes, [ds], [pod], stale=frozenset({pod["metadata"]["uid"]}))
    assert deviceplugin_planner.plan(stale, loaded).ready == set()
