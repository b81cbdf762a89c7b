"""A Module's node labels sent: one patch per node, and the Node Events of ``.ready``.

``nodelabels`` merges what the planners want into one change per node
(pure); ``Sender.patch`` sends those changes, ``_PARALLEL_WRITES`` at a
time, each checked against the freshest cached node just before it goes
(``nodelabels.still_needed``). Once one patch fails transiently (no
answer, throttled, fenced) no more are started: the key's backoff retries
them all, so an outage costs the patches in flight, not one per node.

A patch that sets or removes the Module's ``.ready`` label gets a Node
Event, ``ModuleLoaded`` or ``ModuleUnloaded``, naming the version: the
one the node's loader version label asks for, or, unloading (that label
and the loader pod may be gone already), the one last seen loaded there
(``loaded``, from the loader's plan; unknown after a restart).

``Sender.remove`` takes off every label the operator put on nodes for a
Module (it is deleted, or gone from the cache); the user's own version
label stays.

Limits: it decides no label (the planners do; ``nodelabels`` merges), and
reads no node but from the store it is handed, at the moment it patches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from kmm.api import labels
from kmm.operator import caches, failures, nodelabels, plans, telling, views, writing

__all__ = ["Sender"]

RawObject = dict[str, Any]

# Node label patches in flight at once: enough to converge 500 nodes quickly,
# few enough not to swamp the API server's inflight limit.
_PARALLEL_WRITES = 16


class Sender:
    def __init__(self, writer: writing.Writer, teller: telling.Teller) -> None:
        self.writer = writer
        self.teller = teller
        # Per Module, the version last seen loaded on each node (Node Events).
        self._versions: dict[str, dict[str, str]] = {}

    def loaded(self, key: str, versions: Mapping[str, str]) -> None:
        """The versions the loader's plan saw loaded, by node, for the Module ``key``."""
        if versions:
            self._versions.setdefault(key, {}).update(versions)

    def forget(self, key: str) -> None:
        self._versions.pop(key, None)

    async def remove(self, namespace: str, name: str, *, cached: views.Caches) -> None:
        """Every label the operator put on nodes for the Module (the user's own
        version label stays: it is the user's)."""
        labelled = cached.nodes.by_index(caches.MODULE_INDEX, f"{namespace}/{name}")
        owned = [
            k
            for k in labels.node_label_keys(namespace, name)
            if k != labels.module_version(namespace, name)
        ]
        gone = plans.Plan()
        for node in labelled:
            for key in owned:
                gone.want(node["metadata"]["name"], key, None)
        with failures.step("merging the node labels"):
            changes = nodelabels.merge({n["metadata"]["name"]: n for n in labelled}, [gone])
        await self.patch(changes, cached=cached, view=None)

    async def patch(
        self,
        changes: nodelabels.LabelChanges,
        *,
        cached: views.Caches,
        view: views.ModuleView | None,
    ) -> None:
        """One patch per node, ``_PARALLEL_WRITES`` at a time, none started
        once one failed transiently; a Node Event for each ``.ready`` of
        ``view``'s Module set or removed (``view`` None: no Events)."""
        limit = asyncio.Semaphore(_PARALLEL_WRITES)
        outage = asyncio.Event()

        async def one(node_name: str, change: dict[str, str | None]) -> None:
            async with limit:
                if outage.is_set():
                    return
                # The view is as old as the reconcile; another reconcile's
                # write may have landed since (DESIGN §5: no repeated writes).
                node = cached.nodes.get(node_name)
                if node is None:
                    return
                change = nodelabels.still_needed(node, change)
                try:
                    with failures.step(f"patching the labels of node {node_name}"):
                        sent = bool(change) and await self.writer.patch_node_labels(node, change)
                except Exception as err:
                    if failures.transient(err):
                        outage.set()
                    raise
                if sent and view is not None:
                    await self._ready_event(view, node, change)

        await _all(one(n, c) for n, c in sorted(changes.items()))

    async def _ready_event(
        self, view: views.ModuleView, node: RawObject, change: dict[str, str | None]
    ) -> None:
        key = labels.ready(view.namespace, view.name)
        if key not in change:
            return
        name = node["metadata"]["name"]
        loaded_before = self._versions.get(f"{view.namespace}/{view.name}", {})
        # Loading: the version the node's label asks for. Unloading: that
        # label (and the loader pod) may be gone already; the last version
        # seen loaded there is the one unloaded (unknown after a restart).
        version = (
            (node["metadata"].get("labels") or {}).get(
                labels.module_loader_version(view.namespace, view.name)
            )
            if change[key] is not None
            else loaded_before.get(name)
        )
        loaded = change[key] is not None
        what = f"module {view.namespace}/{view.name}" + (f" version {version}" if version else "")
        await self.teller.node_event(
            node,
            reason="ModuleLoaded" if loaded else "ModuleUnloaded",
            message=f"{what} {'loaded' if loaded else 'unloaded'}",
        )


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Run writes concurrently; every one finishes before the first error is raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
