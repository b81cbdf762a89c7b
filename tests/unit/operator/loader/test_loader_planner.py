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


_D1, _D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def _image_of(ds: dict) -> str:
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def test_an_image_kmm_built_is_pinned_by_digest_and_a_rebuild_changes_the_template() -> None:
    module = fixtures.module()
    nodes = [fixtures.node("n0", K68)]
    tag = loader_planner.grouping(fixtures.view(module, nodes)).targets[K68].image
    (pinned,) = loader_planner.plan(fixtures.view(module, nodes), pins={K68: _D1}).apply
    assert _image_of(pinned) == f"{tag}@{_D1}"
    template = pinned["spec"]["template"]["metadata"]["labels"]
    assert template[labels.IMAGE_DIGEST] == labels.image_digest_value(_D1)
    assert labels.IMAGE_DIGEST not in pinned["spec"]["selector"]["matchLabels"]  # immutable
    # The same pair (name, labels) as unpinned: an existing DaemonSet is patched, not replaced.
    (plain,) = loader_planner.plan(fixtures.view(module, nodes)).apply
    assert plain["metadata"]["name"] == pinned["metadata"]["name"]
    assert plain["metadata"]["labels"] == pinned["metadata"]["labels"]
    converged = loader_planner.plan(fixtures.view(module, nodes, [pinned]), pins={K68: _D1})
    assert (converged.apply, converged.delete) == ([], [])
    (rebuilt,) = loader_planner.plan(fixtures.view(module, nodes, [pinned]), pins={K68: _D2}).apply
    assert _image_of(rebuilt) == f"{tag}@{_D2}"


def test_loader_pods_of_an_older_digest_are_replaced_only_when_they_never_loaded() -> None:
    module = fixtures.module()
    nodes = [fixtures.node("n0", K68), fixtures.node("n3", K68)]
    (old,) = loader_planner.plan(fixtures.view(module, nodes), pins={K68: _D1}).apply
    old["metadata"]["uid"] = "uid-ds"
    loaded = fixtures.pod(old, "n0", ready=True)
    refused = fixtures.pod(old, "n3", ready=False)  # its postStart failed: never loaded
    pods = [loaded, refused]
    # The rebuilt image's template is sent first; no pod is touched meanwhile.
    sending = loader_planner.plan(fixtures.view(module, nodes, [old], pods), pins={K68: _D2})
    assert len(sending.apply) == 1
    assert sending.replace == []
    (new,) = sending.apply
    new["metadata"]["uid"] = "uid-ds"
    found = loader_planner.plan(fixtures.view(module, nodes, [new], pods), pins={K68: _D2})
    assert found.apply == []
    assert found.replace == [refused]  # the Ready one keeps its module
    assert found.loaded == {"n0"}
    # One whose node stopped reporting (only Ready turned False): it loaded, it stays.
    lost = fixtures.pod(old, "n3", ready=False)
    lost["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
    kept = loader_planner.plan(fixtures.view(module, nodes, [new], [loaded, lost]), pins={K68: _D2})
    assert kept.replace == []
    # A pod of the new image that is not Ready (yet) is left alone.
    fresh = fixtures.pod(new, "n3", ready=False)
    again = loader_planner.plan(
        fixtures.view(module, nodes, [new], [loaded, fresh]), pins={K68: _D2}
    )
    assert again.replace == []
    # Unpinned (an image kmm did not build): nothing is replaced.
    plain = loader_planner.plan(fixtures.view(module, nodes, [new], pods))
    assert plain.replace == []


def _uid(pod: dict) -> str:
    return str(pod["metadata"]["uid"])


def test_a_ready_loader_pod_from_an_earlier_boot_of_its_node_is_not_loaded() -> None:
    """``stale``: pods ``boots`` marks (their container ran before the node's
    new boot id); Ready by their conditions, they hold nothing since the reboot."""
    module = fixtures.module()
    nodes = [fixtures.node("n0", K68), fixtures.node("n3", K68)]
    (ds,) = loader_planner.plan(fixtures.view(module, nodes)).apply
    before = fixtures.pod(ds, "n0", started="2026-01-01T00:00:00Z")
    pods = [before, fixtures.pod(ds, "n3", started="2026-01-01T00:00:00Z")]
    rebooted = fixtures.view(module, nodes, [ds], pods, stale=frozenset({_uid(before)}))
    plan = loader_planner.plan(rebooted)
    assert plan.targeted == {"n0", "n3"}
    assert plan.loaded == {"n3"}
    assert plan.labels["n0"][labels.ready("ns", "m")] is None
    assert (plan.replace, plan.delete) == ([], [])  # the kubelet starts it again
    # Its container started again in this boot (no longer marked): loaded.
    assert loader_planner.plan(fixtures.view(module, nodes, [ds], pods)).loaded == {"n0", "n3"}


def test_with_a_version_a_loader_pod_from_an_earlier_boot_is_not_loaded_either() -> None:
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["version"] = "v1"
    module = fixtures.module(raw)
    loader_label = labels.module_loader_version("ns", "m")
    ready = labels.ready("ns", "m")
    nodes = [fixtures.node("n0", K68, extra={loader_label: "v1", ready: ""})]
    (ds,) = loader_planner.plan(fixtures.view(module, nodes)).apply
    pod = fixtures.pod(ds, "n0", started="2026-01-01T00:00:00Z")
    stale = loader_planner.plan(
        fixtures.view(module, nodes, [ds], [pod], stale=frozenset({_uid(pod)}))
    )
    assert (stale.loaded, stale.versions, stale.unloading) == (set(), {}, set())
    assert stale.labels["n0"][ready] is None
    assert loader_planner.plan(fixtures.view(module, nodes, [ds], [pod])).versions == {"n0": "v1"}


def test_a_loader_pod_of_the_kernel_its_node_left_is_leaving() -> None:
    """A node rebooted from K68 onto K61: the old kernel's pod that the
    kubelet started again fails there, and is not the Module's failure."""
    module = fixtures.module()
    by_kernel = _desired(loader_planner.plan(fixtures.view(module, _nodes())))
    nodes = [fixtures.node("n0", K61, boot="b"), fixtures.node("n3", K68)]
    old = fixtures.pod(by_kernel[K68], "n0", ready=False)  # its postStart failed
    new = fixtures.pod(by_kernel[K61], "n0", ready=False)
    kept = fixtures.pod(by_kernel[K68], "n3")
    daemonsets = [by_kernel[K68], by_kernel[K61]]
    plan = loader_planner.plan(fixtures.view(module, nodes, daemonsets, [old, new, kept]))
    assert plan.leaving == {old["metadata"]["name"]}
    assert plan.labels["n0"][labels.KERNEL_VERSION_FULL] == K61
    assert plan.targeted == {"n0", "n3"}
    assert plan.loaded == {"n3"}
    # Ready or not (a stale condition of the earlier boot), it never loads n0.
    ready_old = fixtures.pod(by_kernel[K68], "n0")
    again = loader_planner.plan(fixtures.view(module, nodes, daemonsets, [ready_old, kept]))
    assert again.leaving == {ready_old["metadata"]["name"]}
    assert again.loaded == {"n3"}
