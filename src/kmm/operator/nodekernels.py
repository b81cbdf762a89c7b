"""Keeping ``kernel-version.full`` true on every node that carries it.

The loader planner (``loader.planner``) puts the label on the nodes a Module
selects, so that its DaemonSets can select on it, and never takes it off
(Modules share it). A node no Module selects is visited by no Module's
reconcile: after a reboot into another kernel its label would name the old
one, and the moment a selector took the node in again, the old kernel's
loader DaemonSet would start a loader for the wrong kernel there, before
any reconcile could move the label (found by the churn test, issue 16).

This controller, keyed by node name, sets the label to the node's kernel
whenever a node carries it with another value: KMM's ``NodeKernelReconciler``,
for the nodes the operator labelled. Nodes without the label are left
alone, so a fresh start over thousands of nodes costs no write here. On a
node a Module selects, that Module's reconcile moves the label too; both
want the same value, and whichever patch the cache shows first trims the
other (``nodelabels.still_needed``), unless the two run at the same moment:
then a reboot costs one write more. Leaving selected nodes to the Modules
instead would leave the label stale whenever the Module stops selecting the
node (or goes) before its reconcile ran. ``stale`` is the pure part; the
mapping from node events (``node_keys``) enqueues only nodes whose label is
wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmm.api import kernels, labels
from kmm.operator import writing
from kmm.runtime import controllers, stores

__all__ = ["NodeKernelReconciler", "node_keys", "stale"]


def stale(node: Mapping[str, Any]) -> str | None:
    """The value ``kernel-version.full`` should have on ``node``, when it
    carries another one; None when it is right, absent, or the kernel unknown."""
    found = ((node.get("metadata") or {}).get("labels") or {}).get(labels.KERNEL_VERSION_FULL)
    kernel = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
    if found is None or not isinstance(kernel, str) or not kernel:
        return None
    wanted = labels.kernel_value(kernels.node_kernel(kernel))
    return wanted if found != wanted else None


def node_keys(node: stores.RawObject) -> list[str]:
    """The node's name when its label is stale (``handlers.enqueue_mapped``)."""
    return [node["metadata"]["name"]] if stale(node) is not None else []


class NodeKernelReconciler:
    def __init__(self, nodes: stores.Store, writer: writing.Writer) -> None:
        self.nodes = nodes
        self.writer = writer

    async def reconcile(self, key: str) -> controllers.Result:
        node = self.nodes.get(key)
        if node is None:
            return controllers.Result()
        value = stale(node)
        if value is not None:
            await self.writer.patch_node_labels(node, {labels.KERNEL_VERSION_FULL: value})
        return controllers.Result()
