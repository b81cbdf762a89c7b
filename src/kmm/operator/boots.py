"""Which pods of a Module's DaemonSets are Ready from an earlier boot of their node.

A reboot unloads every module. The kubelet then starts each pod's containers
again (new containers: ``postStart`` runs again, and the loader loads again
with no one's help), but until it reports them the API still shows the old
container, Ready: a pod's Ready condition outlives a reboot shorter than the
node controller's grace period, and the kubelet of the new boot posts its
Node's status (the new ``status.nodeInfo.bootID``) as it starts, before it
has restarted any container. Taken as it is, that condition would have
``.ready`` claim a module the reboot unloaded.

``Boots`` remembers, when a cached Node's boot id changes from one non-empty
value to another (``on_update`` of its node handler: the kubelet of a new
boot reported), the container start (``caches.started``) of each pod of a
DaemonSet kmm made on that node: those containers ran in an earlier boot. A
pod whose cached start is still the one remembered is ``stale``, and the
planners take it as not Ready (``views.ModuleView.ready``). The mark goes
once the pod shows another start or none (the kubelet reported: a new
container's ``postStart`` ran in this boot, or none runs), once the pod
goes, or ``PATIENCE`` seconds after it was made.

Cost: nothing per node but its boot id in the node cache; a mark per pod
only for nodes that rebooted, and only until their kubelet reports.

Limits. The marks are the process's memory (every replica keeps its own,
fed by its informers, so a standby that becomes the leader has them): an
operator that starts after a node's new boot id was posted does not see it
change, and takes a pod the kubelet has not reported yet (seconds) as its
list shows it. A node watch that lags behind the pod watch by the whole of
a container's restart (a relist) marks the new container too: ``PATIENCE``
ends that, and the Module's next reconcile (its resync at the latest)
labels the node again. ``PATIENCE`` is far above the time a kubelet takes from its first
Node status to its first pod status; past it, a pod still shown Ready with
the old container would be a kubelet that reports its node and not its
pods.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kmm.operator import caches
from kmm.runtime import informers, stores

__all__ = ["PATIENCE", "Boots"]

PATIENCE: Final = 600.0


@dataclasses.dataclass(frozen=True)
class _Mark:
    started: str  # the start of the container that ran in an earlier boot
    since: float  # monotonic


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _uid(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("uid") or "")


class Boots:
    """The pods Ready from an earlier boot, by uid; fed by ``node_handler``
    and ``pod_handler`` (register them on the Node and pod informers)."""

    def __init__(
        self,
        pods: stores.Store,
        *,
        patience: float = PATIENCE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pods = pods
        self.patience = patience
        self.monotonic = monotonic
        self._marks: dict[str, _Mark] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def node_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Mark the running containers of DaemonSet pods on ``new`` when its boot changed."""
        before, after = caches.boot_id(old), caches.boot_id(new)
        if not before or not after or before == after:
            return
        name = _meta(new).get("name")
        now = self.monotonic()
        self._expire(now)
        # One pass over the cached pods per reboot: an index of pods by node
        # would cost an entry per pod for good, for an event this rare.
        for pod in self.pods.objects():
            if (pod.get("spec") or {}).get("nodeName") != name:
                continue
            uid, start = _uid(pod), caches.started(pod)
            if uid and start is not None:
                self._marks[uid] = _Mark(start, now)

    def pod_updated(self, pod: Mapping[str, Any]) -> None:
        """Forget the mark of ``pod`` once it shows another container (or none)."""
        uid = _uid(pod)
        mark = self._marks.get(uid)
        if mark is not None and caches.started(pod) != mark.started:
            del self._marks[uid]

    def pod_deleted(self, pod: Mapping[str, Any]) -> None:
        self._marks.pop(_uid(pod), None)

    def stale(self, pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
        """The uids of ``pods`` whose shown container ran in an earlier boot."""
        if not self._marks:
            return frozenset()
        now = self.monotonic()
        found: set[str] = set()
        for pod in pods:
            uid = _uid(pod)
            mark = self._marks.get(uid)
            if mark is None:
                continue
            if now - mark.since >= self.patience:
                del self._marks[uid]
            elif caches.started(pod) == mark.started:
                found.add(uid)
        return frozenset(found)

    def _expire(self, now: float) -> None:
        for uid in [u for u, m in self._marks.items() if now - m.since >= self.patience]:
            del self._marks[uid]

    def node_handler(self) -> informers.FuncHandler:
        return informers.FuncHandler(update=self.node_updated)

    def pod_handler(self) -> informers.FuncHandler:
        return informers.FuncHandler(
            add=self.pod_updated,
            update=lambda _old, new: self.pod_updated(new),
            delete=self.pod_deleted,
        )
