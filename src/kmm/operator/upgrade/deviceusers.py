"""Who uses a Module's devices on a node, and whether a device taint sends them away (pure).

A pod uses the devices when a ResourceClaim reserved for it (``status.
reservedFor``, pods only) was allocated devices of the Module's driver on
that node (``dra.planner.holds``: the allocation's node selector matches
it) that the node's DeviceTaintRules select (``Tainted``: whole pools, or
single devices). Those pods keep the old module in use: its unload must
wait until they are gone.

Whether a ``NoExecute`` taint evicts a user is kube-controller-manager's
device-taint eviction controller's rule (``pkg/controller/
devicetainteviction``, 1.35 to 1.37), followed here: it reads the
tolerations the allocation copied into each result (``results[].
tolerations``, from the request's ``exactly.tolerations`` or the chosen
``firstAvailable`` subrequest's), and a result tolerates the taint only
through a toleration whose effect is ``NoExecute`` itself (an empty
effect, which matches every effect for the scheduler, does not stop an
eviction) that matches the key (empty: every key), operator (``Exists``;
``Equal``, the default, compares the value) and value, and has no
``tolerationSeconds`` (with one, the pod is evicted when it runs out).
A claim one of whose tainted results does not tolerate is evicted: its
pods are ``evicted``; the others ``stay``. A ``NoSchedule`` taint evicts
nobody: every user stays.

Limits: no I/O; reads claims as ``caches`` projects them (allocation
results whole, ``reservedFor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Set
from typing import Any

from kmm.api import scheduling

__all__ = ["NO_EXECUTE", "NO_SCHEDULE", "Tainted", "Users", "tolerates", "users"]

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"


@dataclasses.dataclass(frozen=True)
class Tainted:
    """What a node's rules taint: whole pools and single devices (pool, device)
    of one driver, with one taint (key, value, effect); ``every_pool``: every
    device of the driver on the node (where no rule can be written, the
    devices whose users hold a move)."""

    driver: str
    pools: Set[str]
    devices: Set[tuple[str, str]]
    key: str
    value: str
    effect: str
    every_pool: bool = False

    def covers(self, result: Mapping[str, Any]) -> bool:
        """Whether an allocation result is one of the tainted devices."""
        pool, device = result.get("pool"), result.get("device")
        return result.get("driver") == self.driver and (
            self.every_pool or pool in self.pools or (pool, device) in self.devices
        )


@dataclasses.dataclass(frozen=True)
class Users:
    """Pods (``<ns>/<name>``) using the tainted devices: those the taint
    evicts and those that stay."""

    evicted: tuple[str, ...] = ()
    staying: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.evicted or self.staying)


def tolerates(toleration: Mapping[str, Any], *, key: str, value: str, effect: str) -> bool:
    """Whether one ``DeviceToleration`` keeps a pod from eviction by the
    taint: the eviction controller's test (``NoExecute`` effect named,
    ``resourceclaim.ToleratesTaint``, no ``tolerationSeconds``)."""
    if toleration.get("effect") != NO_EXECUTE or effect != NO_EXECUTE:
        return False
    if toleration.get("tolerationSeconds") is not None:
        return False
    wanted = toleration.get("key") or ""
    if wanted and wanted != key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == value


def _evicted(results: Iterable[Mapping[str, Any]], tainted: Tainted) -> bool:
    """Whether a NoExecute taint evicts a claim with these results."""
    if tainted.effect != NO_EXECUTE:
        return False
    return any(
        tainted.covers(r)
        and not any(
            tolerates(t, key=tainted.key, value=tainted.value, effect=tainted.effect)
            for t in r.get("tolerations") or ()
        )
        for r in results
    )


def users(
    claims: Iterable[Mapping[str, Any]], node: Mapping[str, Any], *, tainted: Tainted
) -> Users:
    """The pods whose reserved claims hold tainted devices on ``node``."""
    evicted: set[str] = set()
    staying: set[str] = set()
    for claim in claims:
        status = claim.get("status") or {}
        allocation = status.get("allocation") or {}
        results = [
            r for r in (allocation.get("devices") or {}).get("results") or () if tainted.covers(r)
        ]
        selector = allocation.get("nodeSelector")
        if not results or selector is None:
            continue
        if not scheduling.matches_node_selector(node, selector):
            continue
        namespace = (claim.get("metadata") or {}).get("namespace") or ""
        pods = {
            f"{namespace}/{ref.get('name')}"
            for ref in status.get("reservedFor") or ()
            if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("name")
        }
        (evicted if _evicted(results, tainted) else staying).update(pods)
    # A pod with one evicted claim is evicted whole.
    return Users(evicted=tuple(sorted(evicted)), staying=tuple(sorted(staying - evicted)))
