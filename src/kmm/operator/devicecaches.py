"""What the operator caches of ResourceSlices and DeviceTaintRules, and how they map to Modules.

Ordered upgrades of a DRA Module taint the devices its driver published for
the node being moved (``kmm.operator.upgrade.taints``). Two informers feed
that, beside those of ``caches``, only where the cluster serves what they
list (``wiring``):

- every ResourceSlice (the API filters slices by one driver or one node,
  not by the drivers of every Module). A slice keeps only what says whose
  devices it lists and where (``project_slice``): its name, and in one
  tuple its driver, pool name, node name and its devices' names (``FACTS``;
  no attributes, no capacity, no uid). 5,000 slices of 8 devices cost
  about 2.9 MiB with their index; device-name lists, equal from node to node for a driver,
  are stored once (bounded, as ``stores.compact`` shares strings).
  Indexed by ``DRIVER_INDEX`` (``spec.driver``), so a Module reads its own
  driver's slices, and a slice event finds the Modules naming its driver;
- the DeviceTaintRules kmm made (label ``role`` present), kept whole but
  for the taint's ``timeAdded`` and the conditions' times (few: one per
  pool or device of a node in a move), indexed by ``caches.MODULE_INDEX`` from their Module labels, so
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
    "DRIVER_INDEX",
    "EVICTION_IN_PROGRESS",
    "FACTS",
    "RULE_SELECTOR",
    "eviction",
    "modules_of_slice",
    "project_rule",
    "project_slice",
    "slice_devices",
    "slice_driver_index",
    "slice_node",
    "slice_pool",
]

DRIVER_INDEX: Final = caches.DRIVER_INDEX
# In a slice's projected metadata: (driver, pool, node, device names).
FACTS: Final = "slice"
# The condition the eviction controller writes on NoExecute rules.
EVICTION_IN_PROGRESS: Final = "EvictionInProgress"
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
    """A ResourceSlice's name, and ``FACTS`` in its metadata: (driver, pool
    name, node name or None, its devices' names). No uid, no
    resourceVersion (nothing reads them: an update that changes none of
    these is no event), and one dict per slice, not one per part: 5,000
    slices cost a dict, a tuple and their name each (the node and pool names
    are the Node cache's interned strings)."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    facts = (
        _intern(spec.get("driver")),
        _intern((spec.get("pool") or {}).get("name")),
        sys.intern(node) if isinstance(node, str) and node else None,
        _names(spec.get("devices")),
    )
    return {"metadata": {"name": (obj.get("metadata") or {}).get("name"), FACTS: facts}}


def _facts(obj: Mapping[str, Any]) -> tuple[str, str, str | None, tuple[str, ...]]:
    """(driver, pool, node, device names) of a slice, projected or whole."""
    kept = (obj.get("metadata") or {}).get(FACTS)
    if isinstance(kept, tuple):
        return kept
    projected = project_slice(dict(obj))["metadata"][FACTS]
    found: tuple[str, str, str | None, tuple[str, ...]] = projected
    return found


def slice_driver(obj: Mapping[str, Any]) -> str:
    return _facts(obj)[0]


def slice_pool(obj: Mapping[str, Any]) -> str:
    return _facts(obj)[1]


def slice_node(obj: Mapping[str, Any]) -> str | None:
    """The node a slice's devices are on; None for devices on several nodes
    (``nodeSelector``, ``allNodes``, per-device node selection)."""
    return _facts(obj)[2]


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of a slice's devices."""
    return _facts(obj)[3]


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
# Of the rule's conditions, what the eviction controller says (not when).
_CONDITION_FIELDS: Final = ("type", "status", "message")


def project_rule(obj: stores.RawObject) -> stores.RawObject:
    """A DeviceTaintRule kept whole but for managed fields and the taint's
    ``timeAdded`` (the API server's, compared by no planner); of its status,
    the conditions' type, status and message (the eviction controller's
    ``EvictionInProgress``: how many pods it evicted, how many are left)."""
    kept = _rule_fields(obj)
    taint = (kept.get("spec") or {}).get("taint")
    if isinstance(taint, Mapping) and "timeAdded" in taint:
        spec = {**kept["spec"], "taint": {k: v for k, v in taint.items() if k != "timeAdded"}}
        kept = {**kept, "spec": spec}
    found = (obj.get("status") or {}).get("conditions")
    if isinstance(found, list) and found:
        said = [
            {k: c[k] for k in _CONDITION_FIELDS if k in c} for c in found if isinstance(c, Mapping)
        ]
        kept = {**kept, "status": {"conditions": said}}
    return kept


def eviction(rule: Mapping[str, Any]) -> str | None:
    """The message of a rule's ``EvictionInProgress`` condition (the eviction
    controller's); None while it has written none."""
    for condition in (rule.get("status") or {}).get("conditions") or ():
        if condition.get("type") == EVICTION_IN_PROGRESS:
            message = condition.get("message")
            return str(message) if message else str(condition.get("status") or "")
    return None
