"""Event-to-key mappings."""

from __future__ import annotations

from typing import Any

from kmm.runtime import handlers


def owned(name: str, owner: str, *, kind: str = "Module", controller: bool = True) -> Any:
    ref = {"apiVersion": "x/v1", "kind": kind, "name": owner, "uid": "u", "controller": controller}
    return {"metadata": {"name": name, "namespace": "ns", "ownerReferences": [ref]}}


def test_enqueue_object() -> None:
    keys: list[str] = []
    handler = handlers.enqueue_object(keys.append)
    obj = {"metadata": {"name": "a", "namespace": "ns"}}
    handler.on_add(obj)
    handler.on_update(obj, obj)
    handler.on_delete(obj)
    assert keys == ["ns/a", "ns/a", "ns/a"]


def test_enqueue_owner_only_follows_the_controller_of_that_kind() -> None:
    keys: list[str] = []
    handler = handlers.enqueue_owner(keys.append, kind="Module", api_version="x/v1")
    handler.on_add(owned("ds", "m1"))
    handler.on_add(owned("ds", "m2", controller=False))
    handler.on_add(owned("ds", "m3", kind="Other"))
    assert keys == ["ns/m1"]


def test_enqueue_mapped_uses_old_and_new_state_on_update() -> None:
    keys: list[str] = []

    def by_label(obj: Any) -> list[str]:
        return [obj["metadata"]["labels"]["owner"]]

    handler = handlers.enqueue_mapped(keys.append, by_label)
    old = {"metadata": {"name": "n", "labels": {"owner": "ns/a"}}}
    new = {"metadata": {"name": "n", "labels": {"owner": "ns/b"}}}
    handler.on_update(old, new)
    assert sorted(keys) == ["ns/a", "ns/b"]
