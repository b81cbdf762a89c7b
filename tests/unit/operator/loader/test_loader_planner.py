"""The loader planner: pairs, DaemonSets to send or delete, where the module is loaded."""

from __future__ import annotations

import operator_fixtures as fixtures

from kmm.api import labels
from kmm.operator.loader import builders as loader_builders
from kmm.operator.loader import planner as loader_planner

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


def _desired(plan: loader_planner.LoaderPlan) -> dict[str, dict]:
    return {d["metadata"]["labels"][labels.KERNEL_VERSION_FULL]: d for d in plan.apply}


def test_plan_groups_selected_nodes_into_pairs() -> None:
    module = fixtures.module()
    plan = loader_planner.plan(fixtures.view(module, _nodes()))
    assert sorted(plan.grouping.nodes) == ["5.14.0-427.el9.x86_64", "6.1.0-27-amd64", K68]
    assert plan.grouping.untargeted == ["unknown"]
    assert len(plan.apply) == 3
    assert plan.delete == []
    assert plan.labels["n2"][labels.KERNEL_VERSION_FULL] == "5.14.0-427.el9.x86_64"
    assert "other" not in plan.labels
    assert plan.targeted == {"n0", "n1", "n2", "n3"}


def test_converged_plan_applies_nothing_and_deletes_stale_pairs() -> None:
    module = fixtures.module()
    first = loader_planner.plan(fixtures.view(module, _nodes()))
    stale = loader_builders.daemonset(module, first.grouping.targets[K68])
    stale["metadata"]["name"] = "stray-duplicate"
    again = loader_planner.plan(fixtures.view(module, _nodes(), [*first.apply, stale]))
    assert again.apply == []
    assert again.delete == ["stray-duplicate"]

    fewer = [n for n in _nodes() if n["metadata"]["name"] != "n1"]
    after = loader_planner.plan(fixtures.view(module, fewer, first.apply))
    assert after.apply == []
    assert len(after.delete) == 1


def test_changed_image_replaces_only_that_pair() -> None:
    raw = fixtures.module_raw()
    first = loader_planner.plan(fixtures.view(fixtures.module(raw), _nodes()))
    raw["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["containerImage"] = "r.io/x:v2"
    second = loader_planner.plan(fixtures.view(fixtures.module(raw), _nodes(), first.apply))
    assert [d["spec"]["template"]["spec"]["containers"][0]["image"] for d in second.apply] == [
        "r.io/x:v2"
    ]
    assert len(second.delete) == 1


def test_untolerated_taint_excludes_node_unless_loaded_already() -> None:
    module = fixtures.module()
    taint = [{"key": "gpu", "effect": "NoSchedule"}]
    nodes = [fixtures.node("n1", K61, taints=taint)]
    assert loader_planner.plan(fixtures.view(module, nodes)).apply == []
    ds = loader_planner.plan(fixtures.view(module, [fixtures.node("n1", K61)])).apply[0]
    kept = loader_planner.plan(fixtures.view(module, nodes, [ds], [fixtures.pod(ds, "n1")]))
    assert kept.delete == []
    assert kept.targeted == {"n1"}
    assert kept.loaded == {"n1"}


def test_loaded_needs_the_pod_of_the_nodes_own_pair() -> None:
    module = fixtures.module()
    by_kernel = _desired(loader_planner.plan(fixtures.view(module, _nodes())))
    pods = [
        fixtures.pod(by_kernel[K68], "n0"),
        fixtures.pod(by_kernel[K68], "n3", ready=False),
        fixtures.pod(by_kernel[K68], "n1"),  # wrong pair for n1's kernel
    ]
    plan = loader_planner.plan(fixtures.view(module, _nodes(), list(by_kernel.values()), pods))
    assert plan.loaded == {"n0"}
    assert plan.labels["n0"][labels.ready("ns", "m")] == ""
    assert plan.labels["n3"][labels.ready("ns", "m")] is None
