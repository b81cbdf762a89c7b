"""Ordered upgrades: the action table, its two guards, and what the planner wants."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import labels
from kmm.operator import caches, views
from kmm.operator.deviceplugin import planner as deviceplugin_planner
from kmm.operator.loader import planner as loader_planner
from kmm.operator.upgrade import planner as upgrade_planner
from kmm.runtime import stores

A = upgrade_planner.Action
K68 = fixtures.KERNELS[0]
USER, LOADER, PLUGIN = (
    labels.module_version("ns", "m"),
    labels.module_loader_version("ns", "m"),
    labels.device_plugin_version("ns", "m"),
)
READY = labels.ready("ns", "m")


@pytest.mark.parametrize(
    ("user", "loader", "plugin", "expected"),
    [
        (None, "v1", "v1", A.REMOVE_PLUGIN_LABEL),
        (None, "v1", None, A.REMOVE_LOADER_LABEL),
        ("v2", None, None, A.ADD_LOADER_LABEL),
        ("v2", "v2", None, A.ADD_PLUGIN_LABEL),
        ("v2", "v1", "v1", A.REMOVE_PLUGIN_LABEL),
        ("v2", "v1", None, A.REMOVE_LOADER_LABEL),
        # everything else: nothing
        (None, None, None, A.NOTHING),
        (None, None, "v1", A.NOTHING),
        ("v2", "v2", "v2", A.NOTHING),
        ("v2", "v2", "v1", A.NOTHING),
        ("v2", None, "v1", A.NOTHING),
        ("v2", "v1", "v2", A.NOTHING),
    ],
)
def test_the_table(user: str | None, loader: str | None, plugin: str | None, expected: A) -> None:
    assert upgrade_planner.action(user, loader, plugin) is expected


def test_every_row_of_design_section_5_is_in_the_table() -> None:
    assert len(upgrade_planner.ACTIONS) == 6


def _step(**kwargs: Any) -> upgrade_planner.Step:
    values: dict[str, Any] = dict(
        user="v2", loader=None, plugin=None, ready=False, loaded=False,
        plugin_ready=False, has_plugin=True, blocking_pods=(),
    )  # fmt: skip
    values.update(kwargs)
    return upgrade_planner.step(**values)


def test_the_loader_label_waits_for_the_device_plugin_pod_to_leave() -> None:
    blocked = _step(user=None, loader="v1", blocking_pods=["m-dp-abc"])
    assert blocked.action is A.NOTHING
    assert blocked.description == (
        "device-plugin pod m-dp-abc still on the node; "
        "waiting before removing the module-loader version label"
    )
    assert _step(user=None, loader="v1").action is A.REMOVE_LOADER_LABEL


def test_the_new_loader_label_waits_for_the_old_module_to_unload() -> None:
    waiting = _step(ready=True)
    assert waiting.action is A.NOTHING
    assert ".ready is set" in waiting.description
    assert _step().action is A.ADD_LOADER_LABEL


def test_done_only_when_loaded_and_the_plugin_ready() -> None:
    assert not _step(loader="v2", plugin="v2", loaded=True).done
    assert _step(loader="v2", plugin="v2", loaded=True, plugin_ready=True).done
    assert _step(loader="v2", plugin="v2", loaded=True, has_plugin=False).done


def _view(nodes: list[dict], pods: list[dict] = (), **spec: Any) -> views.ModuleView:  # type: ignore[assignment]
    raw = fixtures.module_raw(**spec)
    raw["spec"]["moduleLoader"]["container"]["version"] = "v2"
    module = fixtures.module(raw)
    store = stores.Store()
    for node in nodes:
        store.put(node)
    labelled = [n for n in nodes if "ns/m" in caches.node_module_index(n)]
    return views.build(raw, module, nodes=store, daemonsets=(), pods=pods, labelled=labelled)


def _plan(v: views.ModuleView) -> upgrade_planner.UpgradePlan:
    loader = loader_planner.plan(v)
    return upgrade_planner.plan(v, loader, deviceplugin_planner.plan(v, loader))


def test_planner_walks_each_node_one_step() -> None:
    nodes = [
        fixtures.node("a", K68, extra={USER: "v2"}),  # fresh: add loader
        fixtures.node("b", K68, extra={USER: "v2", LOADER: "v1", PLUGIN: "v1", READY: ""}),
        fixtures.node("c", K68, extra={USER: "v2", LOADER: "v1", READY: ""}),  # plugin pod left
        fixtures.node("d", K68, extra={USER: "v2", READY: ""}),  # still loaded: wait
        fixtures.node("e", K68, pick=False, extra={LOADER: "v1"}),  # left the selector: unload
    ]
    dp_pod = {"metadata": {"name": "m-dp-c", "labels": {labels.ROLE: "device-plugin"}},
              "spec": {"nodeName": "c"}}  # fmt: skip
    plan = _plan(_view(nodes, [dp_pod], devicePlugin={"container": {"image": "r.io/p:1"}}))
    wanted = {
        n: {k: v for k, v in values.items() if k in (LOADER, PLUGIN)}
        for n, values in plan.labels.items()
    }
    assert wanted == {
        "a": {LOADER: "v2"},
        "b": {PLUGIN: None},
        "c": {},
        "d": {},
        "e": {LOADER: None},
    }
    assert plan.steps["c"].description.startswith("device-plugin pod m-dp-c still on the node")
    assert ".ready is set" in plan.steps["d"].description


def test_ready_stays_until_the_old_loader_pod_is_gone() -> None:
    """The loader label removed, the old pod still unloads in preStop: the
    module is loaded until that pod is gone, so the new loader waits."""
    v1 = _versioned("v1")
    node = fixtures.node("a", K68, extra={USER: "v2", READY: ""})
    [old_loader] = loader_planner.plan(
        _with(v1, [fixtures.node("a", K68, extra={USER: "v1", LOADER: "v1"})], [])
    ).apply
    terminating = fixtures.pod(old_loader, "a", ready=False)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    leaving = _with(_versioned("v2"), [node], [old_loader], [terminating])
    loader = loader_planner.plan(leaving)
    assert loader.labels["a"][READY] == ""  # kept: it is still being unloaded
    assert loader.loaded == set()
    step = upgrade_planner.plan(leaving, loader, deviceplugin_planner.plan(leaving, loader))
    assert LOADER not in step.labels.get("a", {})  # the new version waits
    assert ".ready is set" in step.steps["a"].description

    gone = _with(_versioned("v2"), [node], [old_loader], [])
    assert loader_planner.plan(gone).labels["a"][READY] is None
    unloaded = _with(_versioned("v2"), [fixtures.node("a", K68, extra={USER: "v2"})], [old_loader])
    loader = loader_planner.plan(unloaded)
    step = upgrade_planner.plan(unloaded, loader, deviceplugin_planner.plan(unloaded, loader))
    assert step.labels["a"][LOADER] == "v2"  # and only now the next version's loader

    # A pod that never loaded (not Ready, no `.ready`) is given no `.ready`.
    never = fixtures.node("b", K68, extra={USER: "v2"})
    failed = fixtures.pod(old_loader, "b", ready=False)
    loader = loader_planner.plan(_with(_versioned("v2"), [never], [old_loader], [failed]))
    assert loader.labels.get("b", {}).get(READY) is None


def test_version_ready_marks_the_finished_nodes() -> None:
    done = fixtures.node("a", K68, extra={USER: "v2", LOADER: "v2", PLUGIN: "v2"})
    half = fixtures.node("b", K68, extra={USER: "v2", LOADER: "v2"})
    v = _view([done, half])
    loader = loader_planner.LoaderPlan(loaded={"a", "b"})
    plugin = deviceplugin_planner.PluginPlan(enabled=False)
    plan = upgrade_planner.plan(v, loader, plugin)
    assert plan.labels["a"][labels.version_ready("ns", "m")] == "v2"
    # No device plugin: loaded is enough, whatever the plugin label says.
    assert plan.labels["b"][labels.version_ready("ns", "m")] == "v2"
    with_plugin = upgrade_planner.plan(
        v, loader, deviceplugin_planner.PluginPlan(enabled=True, ready={"a"})
    )
    assert with_plugin.labels["a"][labels.version_ready("ns", "m")] == "v2"
    assert with_plugin.labels["b"][labels.version_ready("ns", "m")] is None


def test_no_version_no_upgrade_labels() -> None:
    v = views.build(
        fixtures.module_raw(),
        fixtures.module(),
        nodes=stores.Store(),
        daemonsets=(),
        pods=(),
        labelled=[],
    )
    assert (
        upgrade_planner.plan(
            v, loader_planner.LoaderPlan(), deviceplugin_planner.PluginPlan()
        ).labels
        == {}
    )


def _versioned(version: str, **spec: Any) -> Any:
    raw = fixtures.module_raw(**spec)
    raw["spec"]["moduleLoader"]["container"]["version"] = version
    return fixtures.module(raw)


def _with(
    module: Any, nodes: list[dict], daemonsets: list[dict], pods: list[dict] = ()
) -> views.ModuleView:  # type: ignore[assignment]
    store = stores.Store()
    for node in nodes:
        store.put(node)
    labelled = [n for n in nodes if "ns/m" in caches.node_module_index(n)]
    return views.build({}, module, nodes=store, daemonsets=daemonsets, pods=pods, labelled=labelled)


def test_daemonsets_per_version_and_old_ones_kept_while_nodes_run_them() -> None:
    node = fixtures.node("a", K68, extra={USER: "v1", LOADER: "v1", READY: ""})
    plugin = {"devicePlugin": {"container": {"image": "r.io/p:1"}}}
    v1 = _versioned("v1", **plugin)
    first = loader_planner.plan(_with(v1, [node], []))
    [old_loader] = first.apply
    [old_plugin] = deviceplugin_planner.plan(_with(v1, [node], []), first).apply
    assert old_loader["metadata"]["labels"][labels.MODULE_VERSION] == "v1"
    assert old_loader["spec"]["template"]["spec"]["nodeSelector"][LOADER] == "v1"
    assert old_plugin["spec"]["template"]["spec"]["nodeSelector"] == {READY: "", PLUGIN: "v1"}

    v2 = _versioned("v2", **plugin)
    for ds in (old_loader, old_plugin):
        ds["status"] = {"desiredNumberScheduled": 1}
    pod = fixtures.pod(old_loader, "a")
    moved = _with(v2, [node], [old_loader, old_plugin], [pod])
    loader = loader_planner.plan(moved)
    [new_loader] = loader.apply
    assert new_loader["metadata"]["name"] != old_loader["metadata"]["name"]
    assert loader.delete == []
    assert loader.loaded == {"a"}  # still v1, as its label says
    assert old_loader in loader.current
    plugins = deviceplugin_planner.plan(moved, loader)
    assert plugins.delete == []
    assert len(plugins.apply) == 1

    for ds in (old_loader, old_plugin):
        ds["status"] = {"desiredNumberScheduled": 0}
    drained = _with(v2, [node], [old_loader, old_plugin, new_loader])
    assert loader_planner.plan(drained).delete == [old_loader["metadata"]["name"]]
    assert deviceplugin_planner.plan(drained, loader_planner.plan(drained)).delete == [
        old_plugin["metadata"]["name"]
    ]
    del old_loader["status"]  # not reported yet: never deleted on a guess
    assert loader_planner.plan(_with(v2, [node], [old_loader])).delete == []


def test_status_counts_per_version() -> None:
    from kmm.operator import status

    ds = [
        {"metadata": {"labels": {labels.MODULE_VERSION: "v1"}}, "status": {"desiredNumberScheduled": 2, "numberAvailable": 2}},
        {"metadata": {"labels": {labels.MODULE_VERSION: "v2"}}, "status": {"desiredNumberScheduled": 1, "numberAvailable": 0}},
        {"metadata": {"labels": {labels.MODULE_VERSION: "v2"}}, "status": {"desiredNumberScheduled": 1, "numberAvailable": 1}},
    ]  # fmt: skip
    found = status.counts(4, ds, versioned=True)
    assert (found.desired_number, found.available_number) == (4, 3)
    assert [(v.version, v.desired_number, v.available_number) for v in found.versions or ()] == [
        ("v1", 2, 2),
        ("v2", 2, 1),
    ]
    assert status.counts(4, ds).versions is None
