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
