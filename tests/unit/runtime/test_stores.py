"""Store, keys, projections and index functions."""

from __future__ import annotations

from typing import Any

from kmm.runtime import stores


def pod(name: str, node: str, *, labels: dict[str, str] | None = None, **extra: Any) -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": "1",
            "labels": labels or {},
            "ownerReferences": [{"uid": "owner-1", "kind": "DaemonSet"}],
        },
        "spec": {"nodeName": node},
        **extra,
    }


def test_keys() -> None:
    assert stores.key_of({"metadata": {"name": "n"}}) == "n"
    assert stores.key_of({"metadata": {"name": "n", "namespace": "ns"}}) == "ns/n"
    assert stores.split_key("ns/n") == ("ns", "n")
    assert stores.split_key("n") == (None, "n")


def test_keep_fields_keeps_identity_and_the_paths_asked_for() -> None:
    project = stores.keep_fields("status.nodeInfo.kernelVersion", "metadata.labels", "spec")
    node = {
        "apiVersion": "v1",
        "metadata": {
            "name": "n",
            "uid": "u",
            "resourceVersion": "3",
            "labels": {"a": "b"},
            "annotations": {"big": "x" * 100},
            "managedFields": [{}],
        },
        "spec": {"unschedulable": True, "taints": [{"key": "k"}]},
        "status": {
            "nodeInfo": {"kernelVersion": "6.1.0", "osImage": "x"},
            "images": [{"names": ["a"] * 50}],
        },
    }
    assert project(node) == {
        "metadata": {"name": "n", "uid": "u", "resourceVersion": "3", "labels": {"a": "b"}},
        "spec": {"unschedulable": True, "taints": [{"key": "k"}]},
        "status": {"nodeInfo": {"kernelVersion": "6.1.0"}},
    }


def node(name: str, kernel: Any, **spec: Any) -> Any:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"h": name}},
        "spec": spec,
        "status": {"nodeInfo": {"kernelVersion": kernel, "osImage": "x"}},
    }


def test_keep_fields_stores_equal_values_outside_metadata_once() -> None:
    project = stores.keep_fields("metadata.labels", "spec.taints", "status.nodeInfo.kernelVersion")
    taints = [{"key": "k", "effect": "NoSchedule"}]
    a = project(node("a", "6.8", taints=taints))
    b = project(node("b", "6.8", taints=[{"key": "k", "effect": "NoSchedule"}]))
    assert a["status"] == b["status"] == {"nodeInfo": {"kernelVersion": "6.8"}}
    assert a["status"] is b["status"]
    assert a["spec"] is b["spec"]
    assert a["metadata"] is not b["metadata"]  # per object, never shared
    assert a["metadata"]["labels"] == {"h": "a"}
    # Equal as Python values is not enough: JSON types are kept apart.
    kinds = [project(node(f"n{i}", kernel))["status"] for i, kernel in enumerate((1, True, "1"))]
    assert [s["nodeInfo"]["kernelVersion"] for s in kinds] == [1, True, "1"]
    assert len({id(s) for s in kinds}) == 3


def test_keep_fields_shares_only_small_values() -> None:
    project = stores.keep_fields("spec.taints")
    many = [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(20)]
    a = project(node("a", "6.8", taints=many))
    b = project(node("b", "6.8", taints=[dict(t) for t in many]))
    assert a["spec"] == b["spec"]
    assert a["spec"] is not b["spec"]  # 40 leaves: past the budget, not worth a key


def test_keep_fields_remembers_a_bounded_number_of_values() -> None:
    project = stores.keep_fields("status.nodeInfo.kernelVersion")
    first = [project(node(f"n{i}", f"k{i}"))["status"] for i in range(2000)]
    assert project(node("again", "k0"))["status"] is first[0]
    late = project(node("late", "k1999"))["status"]
    assert late == first[1999]
    assert late is not first[1999]  # past the table's 1,024


def test_keep_fields_whole_subtree_wins_over_a_deeper_path() -> None:
    project = stores.keep_fields("status", "status.phase")
    assert project({"metadata": {"name": "p"}, "status": {"phase": "x", "podIP": "y"}}) == {
        "metadata": {"name": "p"},
        "status": {"phase": "x", "podIP": "y"},
    }


def test_indexes_follow_updates_and_deletes() -> None:
    store = stores.Store(
        indexers={
            "node": stores.by_path("spec.nodeName"),
            "owner": stores.by_owner_uid,
            "role": stores.by_label("role"),
        }
    )
    store.put(pod("a", "n1", labels={"role": "loader"}))
    store.put(pod("b", "n1"))
    assert store.index_keys("node", "n1") == ["ns/a", "ns/b"]
    assert store.index_keys("owner", "owner-1") == ["ns/a", "ns/b"]
    assert store.index_keys("role", "loader") == ["ns/a"]
    old = store.put(pod("a", "n2"))
    assert old is not None
    assert old["spec"]["nodeName"] == "n1"
    assert store.index_keys("node", "n1") == ["ns/b"]
    assert store.index_keys("node", "n2") == ["ns/a"]
    assert store.by_index("role", "loader") == []
    store.delete("ns/b")
    assert store.index_keys("node", "n1") == []
    assert store.index_keys("owner", "owner-1") == ["ns/a"]
    assert len(store) == 1
    assert store.delete("ns/missing") is None


def test_by_path_ignores_missing_and_non_string_values() -> None:
    index = stores.by_path("spec.nodeName")
    assert tuple(index({"spec": {}})) == ()
    assert tuple(index({"spec": {"nodeName": ""}})) == ()
    assert tuple(index({"spec": "odd"})) == ()
