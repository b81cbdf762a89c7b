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
