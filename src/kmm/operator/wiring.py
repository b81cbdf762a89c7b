"""Assembling the operator: informers, the Module controller, the manager.

``Operator`` wires the caches (``caches``) to the controller through
``runtime.handlers`` (each event mapped back to the Modules it concerns),
hands the same events to ``inflight.Pending`` (the cache caught up with a
write), and puts everything under one ``runtime.manager.Manager``: informers
on every replica, the controller only on the leader. ``running`` adds the
HTTP endpoints and the process lifecycle around it.

The Node and pod informers also feed ``boots`` (a Node's new boot id marks
the containers of the pods kmm runs there as an earlier boot's), which the
Module reconciler reads with the caches. Every replica keeps it, as it
keeps the caches: a new leader knows the reboots its informers saw.

A second, small controller keeps ``kernel-version.full`` true on nodes
that carry it (``nodekernels``), keyed by node name, on the same caches.
A third, ``preflight``, answers PreflightValidations (``preflight``), keyed
by the validation's name: its own informer, every validation requeued by a
Module added, deleted or whose spec changed, a preflight pod's events
requeueing its validation (the pods informer already lists them: they carry
the role label), and the build concern's existence checker, reader and
settings shared. It runs only where the API server serves
preflightvalidations (``run`` asks, as for DRA), so an operator installed
without that CRD keeps working.

``run`` first asks the API server (``discovery``) whether it serves
resource.k8s.io/v1 (DeviceClasses and ResourceClaims). Only then are those
two informers started; without it DRA Modules report
``ResourceAPIUnavailable`` and everything else works (a watch on an absent
resource would fail forever).
Then, unless told not to (``device_taints``, ``--no-device-taints``), it
asks which resource.k8s.io version serves DeviceTaintRules
(``deviceapis``); only then do the ResourceSlice and DeviceTaintRule
informers run (``deviceinformers``), and ordered upgrades of DRA Modules
taint the moving nodes' devices (``upgrade.taints``); without, upgrades
go on untainted and the Modules' status says why.

After each list of Nodes, pods and ResourceClaims (the large ones) the
process gives the list's freed pages back (``runtime.heap``).

With an ``Election``, every write the ``writing.Writer`` sends is fenced by
the elector's ``holds``: none leaves past the renew deadline of the last
renewal, even from a reconcile the manager has not cancelled yet.

Healing: a ``runtime.resyncing.Resync`` on the leader requeues every cached
Module each ``resync_period`` seconds, and every handler call that raises is
logged and told to ``handler_errors`` (the operator's metrics). The
``wrap_handler`` seam sees each handler that enqueues Modules as it is
registered, so a test can make one fail and watch the resync heal it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kmm.api import modules, preflight
from kmm.kube import client, listwatch, resources
from kmm.operator import (
    boots,
    caches,
    deviceapis,
    deviceinformers,
    discovery,
    inflight,
    nodekernels,
    podadmission,
    reading,
    reconciler,
    views,
    writing,
)
from kmm.operator.build import asking, existence
from kmm.operator.build import concern as build_concern
from kmm.operator.build import settings as build_settings
from kmm.operator.preflight import reconciler as preflight_reconciler
from kmm.runtime import (
    controllers,
    handlers,
    heap,
    informers,
    leaderelection,
    manager,
    resyncing,
    stores,
)

__all__ = [
    "DEFAULT_RESYNC_PERIOD",
    "Counting",
    "Election",
    "HandlerWrapper",
    "Operator",
]

_log = logging.getLogger(__name__)

# List pages of Nodes and pods: a page of 500 real Nodes parses to ~20 MiB of
# dicts before projection, and the allocator keeps much of that peak around
# the cached objects; 25 per page cuts the resident cost of caching 5,000
# Nodes from ~15 to ~6 MiB (bench/bench_operator.py) for 180 more list
# requests at start.
LIST_PAGE = 25
# controller-runtime's SyncPeriod is 10 hours; ours is short because a
# converged Module's reconcile makes no API write, and a lost event should
# not wait that long.
DEFAULT_RESYNC_PERIOD = 600.0

#: Given the informer's name and a handler the operator registers on it
#: (one that enqueues Modules), returns the handler to register instead.
HandlerWrapper = Callable[[str, informers.Handler], informers.Handler]


@dataclasses.dataclass(frozen=True)
class Election:
    """Lease settings; client-go's defaults."""

    identity: str
    namespace: str
    name: str = "kmm-operator"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Counting:
    """A reconciler wrapper counting reconciles in flight and done, for idleness."""

    def __init__(self, inner: controllers.Reconciler) -> None:
        self.inner = inner
        self.in_flight = 0
        self.done = 0

    async def reconcile(self, key: str) -> controllers.Result:
        self.in_flight += 1
        try:
            return await self.inner.reconcile(key)
        finally:
            self.in_flight -= 1
            self.done += 1


def _trim_after_list(_version: str) -> None:
    heap.trim()


class Operator:
    def __init__(
        self,
        api: client.Client,
        *,
        election: Election | None = None,
        metrics: controllers.Metrics | None = None,
        workers: int = 4,
        instance: str = "kmm-operator",
        resync_period: float = DEFAULT_RESYNC_PERIOD,
        handler_errors: informers.HandlerErrors | None = None,
        wrap_handler: HandlerWrapper | None = None,
        build: build_settings.Settings | None = None,
        registry_ca_files: tuple[Path, ...] = (),
        registry_endpoints: Mapping[str, str] | None = None,
        device_taints: bool = True,
    ) -> None:
        # False (--no-device-taints): discovery is not asked for
        # DeviceTaintRules and none is read or written.
        self.device_taints = device_taints
        self.pending = inflight.Pending()
        self.writer = writing.Writer(api, pending=self.pending)
        self.modules = informers.Informer(
            "modules",
            listwatch.ApiListWatch(api, writing.MODULES, kind=modules.KIND),
            handler_errors=handler_errors,
            indexers={
                caches.SELECTOR_INDEX: caches.module_selector_index,
                caches.DRIVER_INDEX: caches.module_driver_index,
                caches.CLASS_INDEX: caches.module_class_index,
            },
        )
        self.daemonsets = informers.Informer(
            "daemonsets",
            listwatch.ApiListWatch(api, resources.DAEMONSETS, kind="DaemonSet"),
            handler_errors=handler_errors,
            label_selector=caches.OWNED_SELECTOR,
            projection=caches.project_daemonset,
            indexers={caches.MODULE_INDEX: caches.object_module_index},
        )
        self.pods = informers.Informer(
            "pods",
            listwatch.ApiListWatch(api, resources.PODS, kind="Pod"),
            handler_errors=handler_errors,
            label_selector=caches.OWNED_SELECTOR,
            projection=caches.project_pod,
            indexers={
                caches.MODULE_INDEX: caches.object_module_index,
                caches.PREFLIGHT_INDEX: caches.preflight_index,
            },
            page_size=LIST_PAGE,
        )
        self.nodes = informers.Informer(
            "nodes",
            listwatch.ApiListWatch(api, resources.NODES, kind="Node"),
            handler_errors=handler_errors,
            projection=caches.project_node,
            indexers={caches.MODULE_INDEX: caches.node_module_index},
            page_size=LIST_PAGE,
        )
        self.device_classes = informers.Informer(
            "deviceclasses",
            listwatch.ApiListWatch(api, resources.DEVICE_CLASSES, kind="DeviceClass"),
            handler_errors=handler_errors,
            projection=stores.keep_fields(*caches.DEVICE_CLASS_FIELDS),
            indexers={caches.MODULE_INDEX: caches.object_module_index},
        )
        self.claims = informers.Informer(
            "resourceclaims",
            listwatch.ApiListWatch(api, resources.RESOURCE_CLAIMS, kind="ResourceClaim"),
            handler_errors=handler_errors,
            projection=stores.keep_fields(*caches.CLAIM_FIELDS),
            indexers={caches.DRIVER_INDEX: caches.claim_driver_index},
            page_size=LIST_PAGE,
        )
        # A list's parsed pages are dropped once projected; give their pages back.
        for listed in (self.pods, self.nodes, self.claims):
            listed.add_relist_hook(_trim_after_list)
        self.api = api
        self.boots = boots.Boots(self.pods.store)
        self.nodes.add_handler(self.boots.node_handler())
        self.pods.add_handler(self.boots.pod_handler())
        self.caches = views.Caches(
            modules=self.modules.store,
            daemonsets=self.daemonsets.store,
            pods=self.pods.store,
            nodes=self.nodes.store,
            device_classes=self.device_classes.store,
            claims=self.claims.store,
            boots=self.boots,
        )
        # Image existence for build and sign: its facts live as long as the
        # process (a restarted operator asks each registry once); its checks
        # run beside the reconciles, which it requeues when answers land.
        self.asker = asking.Asker(ca_files=registry_ca_files, endpoints=registry_endpoints)
        self.checker = existence.Checker(self.asker, delete=self.asker.delete)
        configured = build or build_settings.Settings(
            registry_ca=build_settings.registry_ca_bundle(registry_ca_files)
        )
        reader = reading.ApiReader(api)
        self.build = build_concern.BuildConcern(self.checker, reader, configured)
        self.reconciler = reconciler.ModuleReconciler(
            self.caches,
            self.writer,
            instance=instance,
            build=self.build,
            admission=podadmission.PodAdmission(reader, self.writer),
        )
        self.counting = Counting(self.reconciler)
        self.controller = controllers.Controller(
            "module", self.counting, workers=workers, metrics=metrics
        )
        enqueue = self.controller.enqueue
        self.build.enqueue = enqueue
        modules_store = self.modules.store
        wrap = wrap_handler or (lambda _name, handler: handler)

        def requeueing(informer: informers.Informer, handler: informers.Handler) -> None:
            informer.add_handler(wrap(informer.name, handler))

        def owner(obj: stores.RawObject) -> list[str]:
            key = caches.module_of_object(obj)
            return [key] if key else []

        # Pending first: a reconcile the event triggers must see it cleared.
        self.pending.follow(self.modules)
        requeueing(self.modules, handlers.enqueue_object(enqueue))
        self.pending.follow(self.daemonsets)
        requeueing(self.daemonsets, handlers.enqueue_mapped(enqueue, owner))
        self.pending.follow(self.pods, inflight.POD_PREFIX)
        requeueing(self.pods, handlers.enqueue_mapped(enqueue, owner))
        self.pending.follow(self.nodes)
        requeueing(
            self.nodes,
            handlers.enqueue_mapped(
                enqueue, lambda node: caches.modules_of_node(node, modules_store)
            ),
        )
        self.pending.follow(self.device_classes, inflight.CLASS_PREFIX)
        requeueing(
            self.device_classes,
            handlers.enqueue_mapped(
                enqueue, lambda dc: caches.modules_of_device_class(dc, modules_store)
            ),
        )
        requeueing(
            self.claims,
            handlers.enqueue_mapped(
                enqueue, lambda claim: caches.modules_of_claim(claim, modules_store)
            ),
        )
        self.device_informers = deviceinformers.DeviceInformers(
            api,
            modules_store=modules_store,
            pending=self.pending,
            requeueing=requeueing,
            enqueue=enqueue,
            handler_errors=handler_errors,
            page_size=LIST_PAGE,
        )
        self.caches = dataclasses.replace(
            self.caches,
            slices=self.device_informers.slices.store,
            taint_rules=self.device_informers.rules.store,
        )
        # kernel-version.full on nodes no Module visits (``nodekernels``).
        self.kernel_labels = Counting(
            nodekernels.NodeKernelReconciler(self.nodes.store, self.writer)
        )
        self.kernel_controller = controllers.Controller(
            "node-kernel", self.kernel_labels, metrics=metrics
        )
        requeueing(
            self.nodes,
            handlers.enqueue_mapped(self.kernel_controller.enqueue, nodekernels.node_keys),
        )
        self.resyncer = resyncing.Resync(
            "resync/modules", modules_store.list_keys, enqueue, period=resync_period
        )

        # PreflightValidations (``preflight``), on the same caches.
        self.validations = informers.Informer(
            "preflightvalidations",
            listwatch.ApiListWatch(api, writing.PREFLIGHTS, kind=preflight.KIND),
            handler_errors=handler_errors,
        )
        self.preflight = Counting(
            preflight_reconciler.PreflightReconciler(
                self.validations.store,
                modules_store,
                self.pods.store,
                self.writer,
                checker=self.checker,
                reader=reader,
                settings=configured,
                enqueue=lambda name: self.preflight_controller.enqueue(name),
            )
        )
        self.preflight_controller = controllers.Controller(
            "preflight", self.preflight, workers=workers, metrics=metrics
        )
        validate = self.preflight_controller.enqueue
        validations_store = self.validations.store

        def every_validation(old: stores.RawObject | None, new: stores.RawObject | None) -> None:
            if caches.validations_of_module_change(old, new):
                for name in validations_store.list_keys():
                    validate(name)

        self.pending.follow(self.validations, inflight.PREFLIGHT_PREFIX)
        requeueing(self.validations, handlers.enqueue_object(validate))
        requeueing(
            self.modules,
            informers.FuncHandler(
                add=lambda obj: every_validation(None, obj),
                update=every_validation,
                delete=lambda obj: every_validation(obj, None),
            ),
        )
        requeueing(self.pods, handlers.enqueue_mapped(validate, caches.validations_of_pod))
        # Until ``run`` found the resource served.
        self.validating = False
        self.preflight_resyncer = resyncing.Resync(
            "resync/preflightvalidations",
            validations_store.list_keys,
            validate,
            period=resync_period,
        )

        self.elector: leaderelection.LeaderElector | None = None
        if election is not None:
            self.elector = leaderelection.LeaderElector(
                leaderelection.ApiLeases(api),
                election.identity,
                namespace=election.namespace,
                name=election.name,
                lease_duration=election.lease_duration,
                renew_deadline=election.renew_deadline,
                retry_period=election.retry_period,
            )
            # Not one write once another replica may lead (DESIGN §5, issue 16).
            self.writer.fence = self.elector.holds
        self.manager = manager.Manager(elector=self.elector)
        for informer in (self.modules, self.daemonsets, self.pods, self.nodes):
            self.manager.add_informer(informer)
        self.manager.add_controller(self.controller)
        self.manager.add_controller(self.kernel_controller)
        self.manager.add(self.checker, leader_only=True)
        self.manager.add(self.resyncer, leader_only=True)

    def leading(self) -> bool:
        if self.elector is None:
            return self.manager.started_leading.is_set()
        return self.elector.is_leader()

    def informers(self) -> tuple[informers.Informer, ...]:
        """The informers this operator runs (the DRA two only where the API serves them)."""
        found: tuple[informers.Informer, ...] = (
            self.modules,
            self.daemonsets,
            self.pods,
            self.nodes,
        )
        if self.caches.resource_api:
            found += (self.device_classes, self.claims)
        if self.caches.taint_api is not None:
            found += (self.device_informers.slices, self.device_informers.rules)
        if self.validating:
            found += (self.validations,)
        return found

    def cached(self) -> dict[str, int]:
        return {informer.name: len(informer.store) for informer in self.informers()}

    def registry_requests(self) -> tuple[int, dict[str, int]]:
        """HTTP requests sent to registries, and existence checks by outcome
        (``kmm_registry_requests_total``, ``kmm_registry_checks_total``)."""
        return self.asker.requests, dict(self.checker.checks)

    def relists(self) -> dict[tuple[str, str], int]:
        """Completed lists per (informer, reason): ``kmm_informer_relists_total``."""
        return {
            (informer.name, reason): count
            for informer in self.informers()
            for reason, count in informer.relists.items()
        }

    def idle(self) -> bool:
        """Nothing queued, delayed or running, no registry check in flight
        (tests wait for this, then count writes)."""
        return self.checker.running() == 0 and all(
            len(controller.queue) == 0 and controller.queue.delayed == 0 and count.in_flight == 0
            for controller, count in (
                (self.controller, self.counting),
                (self.kernel_controller, self.kernel_labels),
                (self.preflight_controller, self.preflight),
            )
        )

    def resync(self) -> None:
        """Enqueue every Module and every PreflightValidation now: one round
        of the periodic resyncs."""
        self.resyncer.resync()
        self.preflight_resyncer.resync()

    async def run(self, stop: asyncio.Event) -> None:
        served = await discovery.serves_resource_api(self.api, stop)
        validating = await discovery.serves_preflight(self.api, stop)
        taint_api = (
            deviceapis.taint_rules_version(
                await deviceinformers.served_versions(
                    lambda version, until: discovery.serves(self.api, version, until), stop
                )
            )
            if served and self.device_taints
            else None
        )
        if stop.is_set():
            return
        if served:
            self.manager.add_informer(self.device_classes)
            self.manager.add_informer(self.claims)
        else:
            _log.warning("the cluster does not serve resource.k8s.io/v1: DRA Modules stay Degraded")
        if taint_api is not None:
            for informer in self.device_informers.start(taint_api):
                self.manager.add_informer(informer)
        elif not self.device_taints:
            _log.info("%s", deviceapis.TURNED_OFF)
        else:
            _log.warning("%s", deviceapis.NOT_SERVED)
        if validating:
            self.manager.add_informer(self.validations)
            self.manager.add_controller(self.preflight_controller)
            self.manager.add(self.preflight_resyncer, leader_only=True)
        else:
            _log.warning(
                "the cluster does not serve %s: PreflightValidations are not answered",
                writing.PREFLIGHTS.plural,
            )
        self.validating = validating
        self.caches = dataclasses.replace(
            self.caches,
            resource_api=served,
            taint_api=taint_api,
            taints_off=not self.device_taints,
        )
        self.reconciler.caches = self.caches
        await self.manager.run(stop)

    def describe(self) -> dict[str, Any]:
        return {
            "cached": self.cached(),
            "leading": self.leading(),
            "reconciles": self.counting.done,
            "preflight_reconciles": self.preflight.done,
            "resyncs": self.resyncer.resyncs,
        }
