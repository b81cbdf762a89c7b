"""Device taints in ordered upgrades: a moving node's DeviceTaintRules for a DRA Module (pure).

Seed 003 leaves the module's users to the admin; with DRA the API can keep
new claims off a node's devices, and evict exactly the pods that use them
(KEP-5055): a ``DeviceTaintRule`` taints the devices its selector picks
(driver, pool, device; no CEL, no class). For a DRA Module with ordered
upgrades, on a cluster serving DeviceTaintRules (``view.taint_api``;
``deviceapis``), ``plan`` wants, for each node *in a move* (from the moment
it is chosen, its user version label differing from the loader's or
removed, until ``.version.ready`` equals the user's value, or, removed,
until the operator's version labels are gone; a first load is no move):

- one rule per pool of the Module's driver that ResourceSlices publish for
  that node only, or per device when the pool spans other nodes too; only
  slices of ``spec.dra.driverName`` naming the node, and only while a DRA
  pod counted as the Module's (``ownership``) runs there: the slices are
  its driver's. Rules already made for the node are kept for the rest of
  the move (the driver leaves, its slices with it; the next version's
  driver publishes again). When another Module runs a DRA pod of the same
  driver name on the node (``view.rivals``), its slices cannot be told
  apart: nothing is tainted there, and the node's entry says why;
- effect ``NoSchedule`` (new claims kept off), or ``NoExecute`` when the
  Module carries ``labels.EVICT_DEVICE_USERS: "true"`` (the eviction
  controller deletes the pods whose claims hold the devices, unless they
  tolerate the taint: ``deviceusers``);
- the node's ``upgrade.planner.Holding``: its device-plugin label, which
  sends the DRA driver away, stays until every rule is in the cache with
  its effect (a NoExecute taint before the driver leaves: the kubelet
  needs the driver to unprepare the evicted pods' claims) and no pod
  holds a claim on the tainted devices any more.

Rules are labelled with the Module (namespace, name, role ``dra``, uid: as
DeviceClasses, ``ownership``) and annotated with their node
(``labels.TAINTED_NODE``), named by ``labels.taint_rule_name`` and
hash-stamped (``objects.stamped``), so a changed effect is applied. Every
rule labelled for the Module that is not wanted is deleted: of a node whose
move ended, of a Module without DRA or versions, of an earlier Module of the
same name (another uid: no live Module has it). A rule without any uid
label is not kmm's and is left alone. Without a served API nothing is
wanted and ``message`` says why (``deviceapis.NOT_SERVED``, or
``TURNED_OFF`` for an operator told not to use them): the upgrade
goes on as without taints, except that a moving node's driver stays while
pods hold claims on its devices there (named, as under ``NoSchedule``), so
that the kubelet can unprepare them when they are deleted.

Limits: no I/O. Sending is ``taintrules``'; a Module's deletion, and one
gone, are ``finalizing``'s (``taintrules.Sender.remove``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kmm.api import labels
from kmm.operator import deviceapis, devicecaches, objects, views
from kmm.operator.upgrade import deviceusers
from kmm.operator.upgrade import planner as upgrade_planner

__all__ = ["NodeTaints", "TaintPlan", "effect", "moving", "plan", "rule"]

RawObject = dict[str, Any]
# The effect of a node's entry where the server serves no rules.
UNTAINTED = upgrade_planner.UNTAINTED
# (pool, device); device "" for the whole pool.
Selector = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class NodeTaints:
    """A moving node's rules (names), their effect, what holds its driver,
    and why nothing is tainted (``message``) when so."""

    node: str
    effect: str
    rules: tuple[str, ...] = ()
    holding: upgrade_planner.Holding | None = None
    message: str | None = None


@dataclasses.dataclass
class TaintPlan:
    """Rules to create, to apply (changed), and observed ones to delete; per
    moving node what it has; ``message``: why taints are not used."""

    enabled: bool = False
    api: str | None = None
    create: list[RawObject] = dataclasses.field(default_factory=list)
    # (desired, observed): the Module's rules whose effect changed.
    apply: list[tuple[RawObject, RawObject]] = dataclasses.field(default_factory=list)
    delete: list[RawObject] = dataclasses.field(default_factory=list)
    nodes: dict[str, NodeTaints] = dataclasses.field(default_factory=dict)
    message: str | None = None

    def holdings(self) -> dict[str, upgrade_planner.Holding]:
        return {n: t.holding for n, t in self.nodes.items() if t.holding is not None}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = _meta(obj).get("labels") or {}
    return found


def effect(view: views.ModuleView) -> str:
    """``NoExecute`` when the Module opted in to eviction, else ``NoSchedule``."""
    annotations = view.module.metadata.annotations or {}
    opted = annotations.get(labels.EVICT_DEVICE_USERS) == "true"
    return deviceusers.NO_EXECUTE if opted else deviceusers.NO_SCHEDULE


def moving(
    view: views.ModuleView, node: Mapping[str, Any], *, selected: bool, kept: bool = False
) -> bool:
    """Whether ``node`` is in a move: chosen (an operator version label
    differs from the user's, or is left while the user's is gone), or, once
    it has rules (``kept``), not yet at the user's version (``.version.ready``).
    A first load is no move: no older version is there, no device is in use,
    and the new driver's devices are not ready before the node is.
    ``selected``: the Module's selector picks it (a node it does not counts
    as unlabelled)."""
    ns, name = view.namespace, view.name
    found = _labels(node)
    user = found.get(labels.module_version(ns, name)) if selected else None
    operators = (
        found.get(labels.module_loader_version(ns, name)),
        found.get(labels.device_plugin_version(ns, name)),
    )
    if any(value is not None and value != user for value in operators):
        return True
    return kept and user is not None and found.get(labels.version_ready(ns, name)) != user


def rule(
    view: views.ModuleView, node: str, *, selector: Selector, taint_effect: str, api: str
) -> RawObject:
    """The desired DeviceTaintRule for one pool (or device) of ``node``, hash-stamped."""
    dra = view.module.spec.dra
    driver = dra.driver_name if dra is not None else ""
    pool, device = selector
    uid = view.module.metadata.uid or ""
    picked: RawObject = {"driver": driver, "pool": pool}
    if device:
        picked["device"] = device
    return objects.stamped(
        {
            "apiVersion": f"{deviceapis.GROUP}/{api}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": labels.taint_rule_name(
                    view.namespace,
                    view.name,
                    uid=uid,
                    node=node,
                    driver=driver,
                    pool=pool,
                    device=device,
                ),
                "labels": {
                    **labels.module_labels(view.namespace, view.name, "dra"),
                    labels.MODULE_UID: uid,
                },
                "annotations": {labels.TAINTED_NODE: node},
            },
            "spec": {
                "deviceSelector": picked,
                "taint": {
                    "key": labels.TAINT_KEY,
                    "value": labels.taint_value(view.namespace, view.name),
                    "effect": taint_effect,
                },
            },
        }
    )


def _published(view: views.ModuleView, node: str, driver: str) -> set[Selector]:
    """What the driver's slices publish for ``node``: whole pools found on
    that node only, single devices of pools that span other nodes too."""
    if not view.pods_on(node, "dra"):
        return set()  # no driver of this Module's there: not its slices
    spans: dict[str, set[str | None]] = {}
    for found in view.slices:
        if devicecaches.slice_driver(found) == driver:
            spans.setdefault(devicecaches.slice_pool(found), set()).add(
                devicecaches.slice_node(found)
            )
    picked: set[Selector] = set()
    for found in view.slices:
        if devicecaches.slice_driver(found) != driver or devicecaches.slice_node(found) != node:
            continue
        pool = devicecaches.slice_pool(found)
        if spans[pool] == {node}:
            picked.add((pool, ""))
        else:
            picked.update((pool, device) for device in devicecaches.slice_devices(found))
    return picked


def _owned(found: Mapping[str, Any], uid: str | None) -> bool:
    return bool(uid) and _labels(found).get(labels.MODULE_UID) == uid


def _kept(rules: Iterable[Mapping[str, Any]], node: str, uid: str | None) -> set[Selector]:
    """The selectors of the Module's rules already made for ``node``."""
    kept: set[Selector] = set()
    for found in rules:
        annotations = _meta(found).get("annotations") or {}
        if not _owned(found, uid) or annotations.get(labels.TAINTED_NODE) != node:
            continue
        picked = (found.get("spec") or {}).get("deviceSelector") or {}
        kept.add((str(picked.get("pool") or ""), str(picked.get("device") or "")))
    return kept


def _in_place(observed: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    return (
        observed is not None
        and not _meta(observed).get("deletionTimestamp")
        and objects.observed_hash(dict(observed)) == objects.observed_hash(dict(desired))
    )


def _node(
    view: views.ModuleView,
    node_name: str,
    node: Mapping[str, Any],
    *,
    driver: str,
    api: str,
    taint_effect: str,
    observed: Mapping[str, RawObject],
) -> tuple[NodeTaints | None, list[RawObject]]:
    """A moving node's entry and the rules it wants."""
    uid = view.module.metadata.uid
    rivals = sorted(set(view.rivals.get(node_name, ())))
    if rivals:
        why = (
            f"devices not tainted: Module {', '.join(rivals)} also runs a DRA driver named "
            f"{driver} on the node, whose devices cannot be told from this Module's"
        )
        return NodeTaints(node_name, taint_effect, message=why), []
    selectors = _published(view, node_name, driver) | _kept(view.taint_rules, node_name, uid)
    if not selectors:
        return None, []
    desired = [
        rule(view, node_name, selector=s, taint_effect=taint_effect, api=api)
        for s in sorted(selectors)
    ]
    names = tuple(_meta(d)["name"] for d in desired)
    taken = [n for n in names if n in observed and not _owned(observed[n], uid)]
    tainted = deviceusers.Tainted(
        driver=driver,
        pools={p for p, d in selectors if not d},
        devices={(p, d) for p, d in selectors if d},
        key=labels.TAINT_KEY,
        value=labels.taint_value(view.namespace, view.name),
        effect=taint_effect,
    )
    users = deviceusers.users(view.claims, node, tainted=tainted)
    said = sorted({e for n in names if n in observed and (e := devicecaches.eviction(observed[n]))})
    holding = upgrade_planner.Holding(
        effect=taint_effect,
        rules_ready=all(_in_place(observed.get(_meta(d)["name"]), d) for d in desired),
        evicted=users.evicted,
        staying=users.staying,
        eviction="; ".join(said) or None,
    )
    message = (
        f"DeviceTaintRule {', '.join(taken)} exists and is not this Module's" if taken else None
    )
    return NodeTaints(node_name, taint_effect, names, holding, message), desired


def _untainted(
    view: views.ModuleView, node_name: str, node: Mapping[str, Any], *, driver: str
) -> NodeTaints | None:
    """A moving node's entry where no rule can be written: the pods whose
    claims hold a device of the driver there keep the driver (the kubelet
    needs it to unprepare their claims) until they are deleted; None when
    there are none. Without slices to tell pools apart, every device of the
    driver on the node counts (waiting on another Module's user of the same
    driver name is the safe error)."""
    every = deviceusers.Tainted(
        driver=driver,
        pools=frozenset(),
        devices=frozenset(),
        key=labels.TAINT_KEY,
        value=labels.taint_value(view.namespace, view.name),
        effect=deviceusers.NO_SCHEDULE,
        every_pool=True,
    )
    users = deviceusers.users(view.claims, node, tainted=every)
    if not users:
        return None
    holding = upgrade_planner.Holding(effect=UNTAINTED, staying=users.staying)
    return NodeTaints(node_name, UNTAINTED, holding=holding)


def plan(view: views.ModuleView) -> TaintPlan:
    dra = view.module.spec.dra
    result = TaintPlan(
        enabled=dra is not None and view.version is not None and view.resource_api,
        api=view.taint_api,
    )
    uid = view.module.metadata.uid
    observed = {_meta(r)["name"]: r for r in view.taint_rules}
    wanted: dict[str, RawObject] = {}
    if result.enabled and dra is not None and view.taint_api is None:
        result.message = deviceapis.TURNED_OFF if view.taints_off else deviceapis.NOT_SERVED
        selected = view.selected_names()
        for node_name, node in view.nodes().items():
            if moving(view, node, selected=node_name in selected):
                entry = _untainted(view, node_name, node, driver=dra.driver_name)
                if entry is not None:
                    result.nodes[node_name] = entry
    elif result.enabled and dra is not None and view.taint_api is not None:
        taint_effect = effect(view)
        selected = view.selected_names()
        with_rules = {
            str((_meta(r).get("annotations") or {}).get(labels.TAINTED_NODE))
            for r in view.taint_rules
            if _owned(r, uid)
        }
        for node_name, node in view.nodes().items():
            kept = node_name in with_rules
            if not moving(view, node, selected=node_name in selected, kept=kept):
                continue
            entry, desired = _node(
                view,
                node_name,
                node,
                driver=dra.driver_name,
                api=view.taint_api,
                taint_effect=taint_effect,
                observed=observed,
            )
            if entry is not None:
                result.nodes[node_name] = entry
            wanted.update((_meta(d)["name"], d) for d in desired)
    for name, want in sorted(wanted.items()):
        found = observed.get(name)
        if found is None:
            result.create.append(want)
        elif (
            _owned(found, uid)
            and not _in_place(found, want)
            and not _meta(found).get("deletionTimestamp")
        ):
            result.apply.append((want, found))
    for name, found in sorted(observed.items()):
        if (
            name not in wanted
            and labels.MODULE_UID in _labels(found)
            and not _meta(found).get("deletionTimestamp")
        ):
            result.delete.append(found)
    return result
