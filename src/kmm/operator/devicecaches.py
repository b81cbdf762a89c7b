"""What the operator caches of ResourceSlices and DeviceTaintRules, and how they map to Modules.

Ordered upgrades of a DRA Module taint the devices its driver published for
the node being moved (``kmm.operator.upgrade.taints``). Two informers feed
that, beside those of ``caches``, only where the cluster serves what they
list (``wiring``):

- every ResourceSlice (the API filters slices by one driver or one node,
  not by the drivers of every Module). A slice keeps only what says whose
  devices it lists and where (``project_slice``): its driver, pool name,
  node name and its devices' names (``DEVICES``, a tuple in the metadata
  kept, no attributes, no capacity). At 5,000 nodes of one slice each,
  that is a few MiB; device-name lists, equal from node to node for a
  driver, are stored once (bounded, as ``stores.compact`` shares strings).
  Indexed by ``DRIVER_INDEX`` (``spec.driver``), so a Module reads its own
  driver's slices, and a slice event finds the Modules naming its driver;
- the DeviceTaintRules kmm made (label ``role`` present), kept whole but
  for the taint's ``timeAdded`` (few: one per pool or device of a node in
  a move), indexed by ``caches.MODULE_INDEX`` from their Module labels, so
  a Module finds its rules and a rule's event its Module. Which rules are
  a Module's is decided by the uid label (``taints``), never the labels alone.

Limits: pure projections and mappings; the informers are ``wiring``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kmm.api import labels
from kmm.operator import caches
from kmm.runtime import stores

__all__ = [
    "DEVICES",
    "DRIVER_INDEX",
    "RULE_SELECTOR",
    "modules_of_slice",
    "project_rule",
    "project_slice",
    "slice_devices",
    "slice_driver_index",
    "slice_node",
    "slice_pool",
]

DRIVER_INDEX: Final = caches.DRIVER_INDEX
# In a slice's projected metadata: its devices' names, in order.
DEVICES: Final = "devices"
# kmm's rules carry the role label, like every object kmm makes.
RULE_SELECTOR: Final = labels.ROLE

# Equal device-name tuples stored once, up to this many distinct ones.
_SHARED_LIMIT: Final = 1024
_shared_names: dict[tuple[str, ...], tuple[str, ...]] = {}


def _intern(value: Any) -> str:
    return sys.intern(value) if isinstance(value, str) and len(value) <= 253 else ""


def _names(devices: Any) -> tuple[str, ...]:
    found = tuple(
        _intern(d.get("name"))
        for d in (devices if isinstance(devices, list) else ())
        if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    )
    shared = _shared_names.get(found)
    if shared is not None:
        return shared
    if len(_shared_names) < _SHARED_LIMIT:
        _shared_names[found] = found
    return found


def project_slice(obj: stores.RawObject) -> stores.RawObject:
    """A ResourceSlice's name, uid, resourceVersion, driver, pool name, node
    name, and its devices' names (``DEVICES``, in the metadata kept)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    kept_meta: stores.RawObject = {
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
        "resourceVersion": metadata.get("resourceVersion"),
        DEVICES: _names(spec.get("devices")),
    }
    kept_spec: stores.RawObject = {
        "driver": _intern(spec.get("driver")),
        "pool": {"name": _intern((spec.get("pool") or {}).get("name"))},
    }
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        kept_spec["nodeName"] = sys.intern(node)
    return {"metadata": kept_meta, "spec": kept_spec}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("spec") or {}
    return found


def slice_driver(obj: Mapping[str, Any]) -> str:
    found = _spec(obj).get("driver")
    return found if isinstance(found, str) else ""


def slice_pool(obj: Mapping[str, Any]) -> str:
    found = (_spec(obj).get("pool") or {}).get("name")
    return found if isinstance(found, str) else ""


def slice_node(obj: Mapping[str, Any]) -> str | None:
    """The node a slice's devices are on; None for devices on several nodes
    (``nodeSelector``, ``allNodes``, per-device node selection)."""
    found = _spec(obj).get("nodeName")
    return found if isinstance(found, str) and found else None


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of a slice's devices (projected, or whole)."""
    kept = (obj.get("metadata") or {}).get(DEVICES)
    if isinstance(kept, tuple):
        return kept
    return _names(_spec(obj).get("devices"))


def slice_driver_index(obj: stores.RawObject) -> Iterable[str]:
    driver = slice_driver(obj)
    return (driver,) if driver else ()


def modules_of_slice(found: Mapping[str, Any], modules_store: stores.Store) -> list[str]:
    """The Modules whose ``spec.dra.driverName`` is the slice's driver."""
    driver = slice_driver(found)
    return sorted(modules_store.index_keys(caches.DRIVER_INDEX, driver)) if driver else []


_rule_fields = stores.keep_fields(
    "metadata.labels", "metadata.annotations", "metadata.deletionTimestamp", "spec"
)


def project_rule(obj: stores.RawObject) -> stores.RawObject:
    """A DeviceTaintRule kept whole but for status, managed fields and the
    taint's ``timeAdded`` (the API server's, compared by no planner)."""
    kept = _rule_fields(obj)
    taint = (kept.get("spec") or {}).get("taint")
    if isinstance(taint, Mapping) and "timeAdded" in taint:
        spec = {**kept["spec"], "taint": {k: v for k, v in taint.items() if k != "timeAdded"}}
        kept = {**kept, "spec": spec}
    return kept
