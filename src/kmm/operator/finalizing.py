"""A Module being deleted, or gone: what goes before its finalizer, in order.

The finalizer (``labels.FINALIZER``, kept by the reconciler on every live
Module) exists because node labels and DeviceClasses are not ownable: the
garbage collector would leave them behind (DESIGN §5). ``Finalizer.clean_up``
deletes the Module's DaemonSets in seed 003's order, one stage at a time
(the device plugin's and DRA driver's, which use the module; then, once
their pods are gone, the loader's) and waits for the loader pods to go,
since they unload the module on their way out; then it removes the
Module's node labels (``.ready`` among them: true to the end), its
DeviceClasses and DeviceTaintRules (cluster-scoped: nothing namespaced can
own them; a leaked rule keeps devices tainted), and last the finalizer
(seed 000 step 6). Each pod's deletion requeues the Module,
so it waits by returning.

``Finalizer.leftovers`` is for a Module gone from the cache: normally the
finalizer cleaned up, but labels, classes and rules left behind (the
finalizer removed by hand, a crash between the two) go then. At operator
start the rule informer's first list enqueues the Module each rule is
labelled for, so a gone Module's rules go then.

Limits: what is the Module's is ``ownership``'s to say; the writes are
``daemonsets``', ``labelling``'s, ``deviceclasses``' and ``taintrules``'; the per-Module
memories of a gone Module are forgotten by the reconciler, which holds
them all.
"""

from __future__ import annotations

from typing import Any, Final

from kmm.api import labels
from kmm.operator import (
    daemonsets,
    deviceclasses,
    failures,
    labelling,
    ownership,
    taintrules,
    views,
    writing,
)

__all__ = ["Finalizer"]

RawObject = dict[str, Any]

# The roles of a Module's pods, by the order they go when it is deleted.
_WORKLOAD_ROLES: Final = ("device-plugin", "dra")
_LOADER_ROLE: Final = "module-loader"


class Finalizer:
    def __init__(
        self,
        writer: writing.Writer,
        *,
        daemonset_sender: daemonsets.Sender,
        label_sender: labelling.Sender,
        class_sender: deviceclasses.Sender,
        rule_sender: taintrules.Sender | None = None,
    ) -> None:
        self.writer = writer
        self.daemonset_sender = daemonset_sender
        self.label_sender = label_sender
        self.class_sender = class_sender
        self.rule_sender = rule_sender

    async def clean_up(
        self, raw: RawObject, finalizers: list[str], *, cached: views.Caches
    ) -> None:
        """Take down the Module ``raw`` (being deleted) stage by stage; the
        finalizer goes once nothing of it is left."""
        if labels.FINALIZER not in finalizers:
            return
        if await self._pods_still_going(raw, cached):
            return  # their deletions requeue the Module
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        await self.label_sender.remove(namespace, name, cached=cached)
        await self.class_sender.remove(f"{namespace}/{name}", raw, cached=cached)
        if self.rule_sender is not None:
            await self.rule_sender.remove(f"{namespace}/{name}", cached=cached)
        with failures.step("removing the finalizer"):
            await self.writer.set_finalizers(raw, [f for f in finalizers if f != labels.FINALIZER])

    async def leftovers(self, key: str, *, cached: views.Caches) -> None:
        """The node labels and DeviceClasses of the Module ``key``, gone from
        the cache (its uid unknown: ``deviceclasses.Sender.remove``)."""
        namespace, _, name = key.partition("/")
        await self.label_sender.remove(namespace, name, cached=cached)
        await self.class_sender.remove(key, None, cached=cached)
        if self.rule_sender is not None:
            await self.rule_sender.remove(key, cached=cached)

    async def _pods_still_going(self, raw: RawObject, cached: views.Caches) -> bool:
        """Delete the Module's DaemonSets in seed 003's order, one stage at a
        time: the device plugin's and DRA driver's first (they use the module),
        then the loader's; True while a pod of the current stage is left.

        A loader pod unloads the module in ``preStop``, and a real kubelet
        runs that hook only once the pod is deleted; until it is gone the
        module is loaded. Left to the garbage collector, which starts on the
        DaemonSets only once the Module is gone, every pod went after
        ``.ready`` and the finalizer, all at once: the node said unloaded
        while it was not, and a loader's unload could run beside a device
        plugin still using the module. So ``.ready`` and the finalizer stay
        until the last pod of the Module is gone, as in an upgrade (a pod
        stuck on a node that is down holds the Module as it holds a move).
        The pods are the Module's by ``ownership.owned`` (its namespace, its
        DaemonSets' uids, or, their DaemonSet deleted, its labels there): a
        pod labelled as the Module's in another namespace holds nothing.
        """
        for roles in (_WORKLOAD_ROLES, (_LOADER_ROLE,)):
            ours = ownership.owned(raw, daemonsets=cached.daemonsets, pods=cached.pods)
            stage = [
                obj
                for obj in ours.daemonsets
                if views.role(obj) in roles and not obj["metadata"].get("deletionTimestamp")
            ]
            await self.daemonset_sender.delete(
                raw, sorted(obj["metadata"]["name"] for obj in stage), cached=cached
            )
            if any(views.role(pod) in roles for pod in ours.pods):
                return True
        return False
