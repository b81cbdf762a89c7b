"""The operator's in-flight memory (``inflight.Pending``) stays empty on a long-lived leader.

The operator runs in process on a ``kube.client.Client`` that holds back the
reply to each of its writes of a DaemonSet, Module or Node until the
operator's own informer has handed on the event showing that write: the
event wins the race every time, as it does now and then on a loaded API
server, and deterministically here. A write whose event came first must
leave nothing in ``Pending``, or an entry no event will ever clear stays for
the life of the process (issue 23).
"""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import Callable
from typing import Any, Unpack

import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import modules
from kmm.kube import client as kube_client
from kmm.kube import kubeconfigs, objects
from kmm.operator import caches, wiring
from kmm.runtime import informers
from kmm.sandbox import testing

manifests = support.manifests

CYCLES = 50
PLUGIN = {"container": {"image": "example.com/plugin:v1"}}
# How long one reply may wait for its event before the test calls it stuck.
HOLD_BOUND = 60.0


class EventFirst(kube_client.Client):
    """kmm's client, whose write replies come back only once the operator's
    cache shows the write: present at (or past) the reply's resourceVersion,
    or gone (a delete, or the finalizer removal that ends a Module)."""

    def __init__(self, access: kubeconfigs.Access) -> None:
        super().__init__(access)
        self.operator: wiring.Operator | None = None
        self.held: collections.Counter[tuple[str, str]] = collections.Counter()
        self.stuck: list[str] = []
        self._changed = asyncio.Event()

    def follow(self, operator: wiring.Operator) -> None:
        """Wake held replies on every event of the operator's informers
        (registered last, so ``Pending`` has had the event first)."""
        self.operator = operator
        for informer in (operator.daemonsets, operator.modules, operator.nodes):
            informer.add_handler(informers.FuncHandler.each(self._tick))

    def _tick(self, _obj: Any) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def send(
        self, method: str, path: str, **options: Unpack[kube_client.Options]
    ) -> kube_client.Reply:
        reply = await super().send(method, path, **options)
        target = self._target(method.upper(), path)
        if target is not None:
            resource, informer, key = target
            shows = self._shows(method.upper(), informer, key, reply)
            self.held[method.upper(), resource] += 1
            try:
                await asyncio.wait_for(self._until(shows), HOLD_BOUND)
            except TimeoutError:
                self.stuck.append(f"{method} {path}")
        return reply

    def _target(self, method: str, path: str) -> tuple[str, informers.Informer, str] | None:
        if self.operator is None or method not in ("PATCH", "DELETE", "PUT"):
            return None
        parts = path.strip("/").split("/")
        found = {
            "daemonsets": self.operator.daemonsets,
            modules.PLURAL: self.operator.modules,
            "nodes": self.operator.nodes,
        }
        for resource, informer in found.items():
            if resource in parts and parts.index(resource) + 1 < len(parts):
                name = parts[parts.index(resource) + 1]
                if "namespaces" in parts:
                    name = f"{parts[parts.index('namespaces') + 1]}/{name}"
                return resource, informer, name
        return None

    @staticmethod
    def _shows(
        method: str, informer: informers.Informer, key: str, reply: kube_client.Reply
    ) -> Callable[[], bool]:
        version = objects.resource_version(reply.body) if isinstance(reply.body, dict) else None

        def shows() -> bool:
            cached = informer.store.get(key)
            if method == "DELETE":
                return cached is None
            if cached is None:  # not yet made (a create), or gone since (a finalizer removed)
                return reply.status != 201
            return version is None or int(objects.resource_version(cached) or 0) >= int(version)

        return shows

    async def _until(self, shows: Callable[[], bool]) -> None:
        while not shows():
            changed = self._changed
            await changed.wait()


async def test_writes_whose_events_beat_their_replies_leave_nothing_in_flight(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """50 Modules, one after the other: each made with a device plugin, the
    plugin switched off (the operator deletes its DaemonSet), the Module
    deleted (the operator removes its finalizer). Every one of those writes
    is answered only after its event: before the fix the cycles left
    entries no event would clear (the DaemonSet's delete, the Module's last
    patch): 90 of them after 50 cycles."""
    custom = client.CustomObjectsApi(api_client)
    async with EventFirst(kubeconfigs.load(sandbox.kubeconfig)) as api:
        op = wiring.Operator(api, workers=2)
        api.follow(op)
        stop = asyncio.Event()
        task = asyncio.ensure_future(op.run(stop))
        running = support.InProcess(op, api.counter, task)
        try:
            await testing.eventually(running.synced, "the operator's caches synced")
            for cycle in range(CYCLES):
                name = f"pending-{cycle}"
                key = f"{namespace}/{name}"
                body = support.module_body(name, {"kmm-pending-test": "none"}, devicePlugin=PLUGIN)
                await support.create_module(api_client, namespace, body)

                async def plugin_ds(want: bool, key: str = key) -> bool:
                    owned = op.daemonsets.store.by_index(caches.MODULE_INDEX, key)
                    return bool(owned) is want

                await testing.eventually(lambda: plugin_ds(True), f"{key}'s DaemonSet")
                current = await custom.get_namespaced_custom_object(
                    modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
                )
                off = copy.deepcopy(current)
                del off["spec"]["devicePlugin"]
                await custom.replace_namespaced_custom_object(
                    modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name, off
                )
                await testing.eventually(lambda: plugin_ds(False), f"{key}'s DaemonSet deleted")
                await custom.delete_namespaced_custom_object(
                    modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
                )

                async def module_gone(key: str = key) -> bool:
                    return op.modules.store.get(key) is None

                await testing.eventually(module_gone, f"{key} deleted")
            await running.wait_idle("the operator idle after the last cycle")
            assert api.stuck == []
            # Every cycle's writes went through the race: the plugin's DaemonSet
            # applied and deleted, the Module's finalizer added and removed.
            assert api.held["DELETE", "daemonsets"] == CYCLES, api.held
            assert api.held["PATCH", "daemonsets"] == CYCLES, api.held
            assert api.held["PATCH", modules.PLURAL] >= 2 * CYCLES, api.held
            assert len(op.pending) == 0
        finally:
            stop.set()
            await task
