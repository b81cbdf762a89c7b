"""A DRA Module's DeviceTaintRules sent: created, updated and deleted, each refusal its own.

``Sender.send`` carries out what ``upgrade.taints`` wants
(``TaintPlan``: ``create``, ``apply``, ``delete``), in the resource.k8s.io
version the server serves (``deviceapis.rules_resource``). A rule is
created with a plain create (a name someone else took fails, and is never
taken over), updated by server-side apply (its effect changed: the API
server then moves the taint's ``timeAdded``, from which tolerations count),
deleted guarded by its observed uid (one never observed is nothing of the
Module's to delete); creates and deletes have their Event. A refused write
(``failures.refused``: invalid, forbidden, the server's error) is the
rule's problem (``DeviceTaintRuleRefused``, one Warning Event per distinct
refusal, ``telling``), retried with the key's backoff: the node's upgrade
waits on its rules (the step says so), so a refusal must not pass silently.

Cluster-scoped rules cannot be owned by a namespaced Module: ``remove``
deletes them when the Module is deleted (``finalizing``), or gone from the
cache with its finalizer removed by hand (at operator start, the rule
informer's first list requeues each Module its rules name, and a gone one's
reconcile removes them): a leaked rule would keep devices tainted.

Limits: which rules a Module wants is the planner's (pure); this module
only sends, and needs the served version (``Caches.taint_api``).
"""

from __future__ import annotations

from typing import Any, Final

from kmm.api import labels
from kmm.operator import caches, deviceapis, failures, status, telling, views, writing
from kmm.operator.upgrade import taints as upgrade_taints

__all__ = ["REASON_REFUSED", "Sender"]

RawObject = dict[str, Any]
REASON_REFUSED: Final = "DeviceTaintRuleRefused"


class Sender:
    def __init__(self, writer: writing.Writer, teller: telling.Teller) -> None:
        self.writer = writer
        self.teller = teller

    async def send(
        self, raw: RawObject, key: str, plan: upgrade_taints.TaintPlan
    ) -> list[status.Problem]:
        """Delete, create and update the Module's rules; the refusals, to
        retry with the key's backoff."""
        if plan.api is None:
            return []
        resource = deviceapis.rules_resource(plan.api)
        refused: list[status.Problem] = []
        for gone in plan.delete:
            name = gone["metadata"]["name"]
            with failures.step(f"deleting DeviceTaintRule {name}"):
                deleted = await self.writer.delete_taint_rule(resource, gone)
            if deleted:
                await self.teller.event(
                    raw, "Normal", "DeviceTaintRuleDeleted", f"deleted DeviceTaintRule {name}"
                )
        sending: list[tuple[RawObject, RawObject | None]] = [
            *((d, None) for d in plan.create),
            *plan.apply,
        ]
        for desired, observed in sending:
            name = desired["metadata"]["name"]
            node = desired["metadata"]["annotations"][labels.TAINTED_NODE]
            try:
                with failures.step(f"sending DeviceTaintRule {name}"):
                    if observed is not None:
                        await self.writer.apply_taint_rule(resource, desired, observed)
                    elif await self.writer.create_taint_rule(resource, desired):
                        effect = desired["spec"]["taint"]["effect"]
                        said = f"created DeviceTaintRule {name} ({effect}) for node {node}"
                        await self.teller.event(raw, "Normal", "DeviceTaintRuleCreated", said)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = (
                    f"node {node}: the API server refused DeviceTaintRule {name}: "
                    f"{failures.refusal(err)}"
                )
                refused.append(status.Problem(REASON_REFUSED, message))
                await self.teller.tell(raw, key, f"DeviceTaintRule/{name}", REASON_REFUSED, message)
                continue
            self.teller.settled(key, f"DeviceTaintRule/{name}")
        return refused

    async def remove(self, key: str, *, cached: views.Caches) -> None:
        """Delete the rules labelled for the Module ``key`` (being deleted, or
        gone) that carry a uid label (kmm stamped them: its own, and an
        earlier Module's of the same name), each guarded by its observed uid."""
        if cached.taint_api is None:
            return
        resource = deviceapis.rules_resource(cached.taint_api)
        for observed in cached.taint_rules.by_index(caches.MODULE_INDEX, key):
            if labels.MODULE_UID not in (observed["metadata"].get("labels") or {}):
                continue  # not kmm's
            name = observed["metadata"]["name"]
            with failures.step(f"deleting DeviceTaintRule {name}"):
                await self.writer.delete_taint_rule(resource, observed)
