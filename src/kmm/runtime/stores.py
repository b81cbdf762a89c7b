"""The informer's in-memory cache: projected objects by key, with named indexes.

Objects are raw JSON dicts (`RawObject`), never generated model classes:
models cost several times the memory and controllers read few fields.
A `Projection` keeps only what the controllers read (see `keep_fields`), so
5,000 Nodes fit in a few megabytes. Keys are `namespace/name`, or `name` for
cluster-scoped objects, as in client-go. Index functions map an object to
zero or more index values (label value, owner UID, node name...).

The store is written only by its informer; readers get the stored dicts and
must not mutate them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, NewType, TypeAlias

__all__ = [
    "Indexer",
    "Key",
    "Projection",
    "RawObject",
    "Store",
    "by_label",
    "by_owner_uid",
    "by_path",
    "compact",
    "keep_fields",
    "key_of",
    "split_key",
]

RawObject: TypeAlias = dict[str, Any]
Key = NewType("Key", str)
Projection: TypeAlias = Callable[[RawObject], RawObject]
Indexer: TypeAlias = Callable[[RawObject], Iterable[str]]


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = metadata["name"]
    return Key(f"{namespace}/{name}" if namespace else name)


def split_key(key: str) -> tuple[str | None, str]:
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, namespace)


# Strings up to this length are interned: label keys and values, condition
# types and reasons, kernel versions repeat across thousands of objects.
_INTERN_MAX = 64
# Fields that are unique per object: interning them would only grow the
# interpreter's table of interned strings (~2 MiB for 5,000 Nodes).
_UNIQUE_FIELDS = frozenset({"uid", "resourceVersion"})


def compact(value: Any) -> Any:
    """A deep copy sharing repeated short strings (keys and values).

    JSON parsing gives every node its own copy of "kubernetes.io/hostname" and
    "True"; sharing them cuts a projected Node cache by about 40%.
    """
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _INTERN_MAX:
        return sys.intern(value)
    return value


class _SharedValues:
    """One instance of each small JSON value seen, so equal values are stored once.

    Bounded: past ``limit`` distinct values, new ones are kept as they are
    (values worth sharing, such as kernels and taints, are few and come
    early; a value unique to each object, a pod's node name, only fills the
    table). Cached objects are read-only, so sharing between them is safe.
    """

    def __init__(self, limit: int = 1024, max_leaves: int = 16) -> None:
        self._values: dict[Hashable, Any] = {}
        self._limit = limit
        self._max_leaves = max_leaves

    def canonical(self, value: Any) -> Any:
        key = _frozen(value, [self._max_leaves])
        if key is None:
            return value
        found = self._values.get(key)
        if found is not None:
            return found
        if len(self._values) < self._limit:
            self._values[key] = value
        return value


def _frozen(value: Any, budget: list[int]) -> Hashable | None:
    """A hashable form of a JSON value (types kept apart), None past the leaf budget."""
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            frozen = _frozen(v, budget)
            if frozen is None:
                return None
            items.append((k, frozen))
        return ("d", tuple(items))
    if isinstance(value, list):
        elements = []
        for v in value:
            frozen = _frozen(v, budget)
            if frozen is None:
                return None
            elements.append(frozen)
        return ("l", tuple(elements))
    budget[0] -= 1
    if budget[0] < 0:
        return None
    return (type(value).__name__, value)


def keep_fields(*paths: str) -> Projection:
    """A projection keeping dotted paths (`"status.nodeInfo.kernelVersion"`).

    `metadata.name`, `metadata.namespace`, `metadata.uid` and
    `metadata.resourceVersion` are always kept: keys and optimistic writes need
    them. The result is `compact`: short strings are shared between objects.
    """
    tree: dict[str, Any] = {}
    for path in (
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.resourceVersion",
        *paths,
    ):
        node = tree
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if child is None:  # an ancestor is already kept whole
                break
            node = child
        else:
            node[parts[-1]] = None  # None = keep the whole subtree

    shared = _SharedValues()

    def copy(source: Mapping[str, Any], shape: Mapping[str, Any]) -> RawObject:
        out: RawObject = {}
        for name, sub in shape.items():
            if name not in source:
                continue
            value = source[name]
            if name in _UNIQUE_FIELDS:
                out[sys.intern(name)] = value
            elif sub is None or not isinstance(value, Mapping):
                out[sys.intern(name)] = compact(value)
            elif kept := copy(value, sub):
                out[sys.intern(name)] = kept
        return out

    def project(obj: RawObject) -> RawObject:
        out = copy(obj, tree)
        # metadata is per object; the rest (a Node's kernel, its taints, a
        # DaemonSet's counts) is often equal across thousands of objects.
        for name, value in out.items():
            if name != "metadata":
                out[name] = shared.canonical(value)
        return out

    return project


def by_label(label: str) -> Indexer:
    def index(obj: RawObject) -> Iterable[str]:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return (labels[label],) if label in labels else ()

    return index


def by_owner_uid(obj: RawObject) -> Iterable[str]:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return tuple(owner["uid"] for owner in owners if "uid" in owner)


def by_path(path: str) -> Indexer:
    """Index by the string at a dotted path, e.g. `spec.nodeName` for pods."""
    parts = path.split(".")

    def index(obj: RawObject) -> Iterable[str]:
        value: Any = obj
        for part in parts:
            if not isinstance(value, Mapping) or part not in value:
                return ()
            value = value[part]
        return (value,) if isinstance(value, str) and value else ()

    return index


class Store:
    """Objects by key plus named indexes; replaced wholesale on relist."""

    def __init__(self, *, indexers: Mapping[str, Indexer] | None = None) -> None:
        self._objects: dict[Key, RawObject] = {}
        self._indexers: dict[str, Indexer] = dict(indexers or {})
        # index name -> value -> keys
        self._indices: dict[str, dict[str, set[Key]]] = {name: {} for name in self._indexers}

    def get(self, key: str) -> RawObject | None:
        return self._objects.get(Key(key))

    def list_keys(self) -> list[Key]:
        return list(self._objects)

    def objects(self) -> list[RawObject]:
        return list(self._objects.values())

    def __len__(self) -> int:
        return len(self._objects)

    def __iter__(self) -> Iterator[RawObject]:
        return iter(list(self._objects.values()))

    def by_index(self, index: str, value: str) -> list[RawObject]:
        keys = self._indices[index].get(value, ())
        return [self._objects[key] for key in sorted(keys)]

    def index_keys(self, index: str, value: str) -> list[Key]:
        return sorted(self._indices[index].get(value, ()))

    def put(self, obj: RawObject) -> RawObject | None:
        """Insert or replace; return the previous object."""
        key = key_of(obj)
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self._objects[key] = obj
        self._index(key, obj)
        return old

    def delete(self, key: str) -> RawObject | None:
        old = self._objects.pop(Key(key), None)
        if old is not None:
            self._unindex(Key(key), old)
        return old

    def _index(self, key: Key, obj: RawObject) -> None:
        for name, indexer in self._indexers.items():
            values = self._indices[name]
            for value in indexer(obj):
                values.setdefault(value, set()).add(key)

    def _unindex(self, key: Key, obj: RawObject) -> None:
        for name, indexer in self._indexers.items():
            values = self._indices[name]
            for value in indexer(obj):
                keys = values.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del values[value]
