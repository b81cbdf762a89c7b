"""The Module reconciler: one key (``<ns>/<name>``), every concern of the Module.

Level-based (``runtime.controllers.Reconciler``). For a live Module it:
1. keeps the finalizer on it (node labels are not ownable; DESIGN §5);
2. repeats admission (``kmm.api.validation``): an invalid Module gets a
   Degraded condition and one Warning Event, and nothing is created;
3. takes one read-only view of the caches (``views``) and asks each planner
   what it wants: ``build`` first (for kernels whose mapping builds or
   signs: which images exist, asked of registries only when not known,
   ``build.concern``; which build and sign pods to make; which kernels
   wait for their image), then ``loader`` (which skips those kernels),
   ``deviceplugin`` and ``dra`` (they run where the module is loaded),
   then ``upgrade`` (ordered upgrades: version labels, with whichever
   device workload the Module has);
4. sends what they want: build, sign and pull pods created and deleted
   (with their Events), DaemonSets applied when missing or changed (a
   loader pinned to the digest of an image kmm built), stale ones deleted
   (an Event for each create and delete), loader pods of an older pinned
   image that never became Ready deleted (``LoaderPodReplaced``), DeviceClasses
   likewise, and the node labels all of them want, merged into one patch
   per node (``nodelabels``), each checked against the freshest cached node
   just before it goes, with a Node Event when ``.ready`` comes or goes;
5. writes the status (``status``, ``status.images`` among it) only when a
   field it owns changes, and counts-only changes at most once per
   ``STATUS_INTERVAL`` (requeued); a Module whose build or sign pod failed
   (or whose pod is still on its way) is requeued every
   ``--build-input-poll`` seconds to notice changed inputs.
A write the API server refuses (``failures.refused``: invalid, forbidden,
its own 500) stays local: a DaemonSet's is the Module's ``DaemonSetRefused``
problem, a build or sign pod's its kernel's image status and ``PodRefused``,
each with the server's words and one Warning Event per distinct refusal; the
other DaemonSets, pods, labels and the status still go, and the key is
retried with backoff (``Result.requeue``). The pods of a DaemonSet that
admission refuses (Pod Security, a quota) are found by ``podadmission``.
When a step raises otherwise (a planner's bug, an error that is not one
object's), the Module shows it before the controller retries the key with
backoff (``failures``): Degraded ``ReconcileFailed`` naming the step, and a
Warning Event once per distinct message, not once per retry; the next
reconcile that goes through sets Degraded back. Conflicts, throttling and an
unavailable API server are retried without showing.
For a Module being deleted it deletes its DaemonSets in seed 003's order
(device plugin and DRA driver, then, once their pods are gone, the loader)
and waits for the loader pods to go, since they unload the module on their
way out; then it removes its node labels (``.ready`` last of all, true to
the end) and its DeviceClasses (cluster-scoped: nothing namespaced can own
them), then the finalizer (seed 000 step 6).
Everything is read from the informer caches; a converged Module costs no write.

The DRA part is a planner in this reconcile, not a controller of its own
(the seed's "DRA reconciler"): the target labels, the loader's ``.ready``
and the version labels it is gated by are one node's labels, merged into
one patch, judged at one moment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Final, Literal

from kmm.api import conditions, labels, modules, validation
from kmm.kube import errors
from kmm.operator import (
    caches,
    events,
    failures,
    nodelabels,
    objects,
    ownership,
    plans,
    podadmission,
    status,
    views,
    writing,
)
from kmm.operator.build import concern as build_concern
from kmm.operator.build import planner as build_planner
from kmm.operator.deviceplugin import planner as deviceplugin_planner
from kmm.operator.dra import planner as dra_planner
from kmm.operator.loader import planner as loader_planner
from kmm.operator.upgrade import planner as upgrade_planner
from kmm.runtime import controllers, stores

__all__ = ["Caches", "ModuleReconciler", "rfc3339_now"]

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]

# Node label patches in flight at once: enough to converge 500 nodes quickly,
# few enough not to swamp the API server's inflight limit.
_PARALLEL_WRITES = 16
# The roles of a Module's pods, by the order they go when it is deleted.
_WORKLOAD_ROLES: Final = ("device-plugin", "dra")
_LOADER_ROLE: Final = "module-loader"
# While a rollout progresses, counts change with every pod; a status write
# that only moves counts waits until this long after the previous one (a
# condition changing state is written at once). 500 nodes: ~30 status
# writes instead of ~450.
STATUS_INTERVAL = 1.0


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Caches:
    """The stores the reconciler reads (the informers own and fill them)."""

    modules: stores.Store
    daemonsets: stores.Store
    pods: stores.Store
    nodes: stores.Store
    # Filled only when the cluster serves resource.k8s.io/v1 (``resource_api``).
    device_classes: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={caches.MODULE_INDEX: caches.object_module_index}
        )
    )
    claims: stores.Store = dataclasses.field(
        default_factory=lambda: stores.Store(
            indexers={caches.DRIVER_INDEX: caches.claim_driver_index}
        )
    )
    resource_api: bool = True


class ModuleReconciler:
    def __init__(
        self,
        cached: Caches,
        writer: writing.Writer,
        *,
        instance: str = "kmm-operator",
        now: Callable[[], str] = rfc3339_now,
        monotonic: Callable[[], float] = time.monotonic,
        status_interval: float = STATUS_INTERVAL,
        build: build_concern.BuildConcern | None = None,
        admission: podadmission.PodAdmission | None = None,
    ) -> None:
        self.caches = cached
        # None: no image is checked or built (tests of other concerns).
        self.build = build
        # None: no DaemonSet's pods are tried (tests of other concerns).
        self.admission = admission
        self.writer = writer
        self.instance = instance
        self.now = now
        self.monotonic = monotonic
        self.status_interval = status_interval
        self._status_written: dict[str, float] = {}
        # Per Module, the version last seen loaded on each node (Node Events).
        self._versions: dict[str, dict[str, str]] = {}
        # Per Module, DeviceClasses the API server refused: name -> (spec
        # hash, its message). The same class is not sent again (it would be
        # refused again, every reconcile); a changed one is.
        self._refused: dict[str, dict[str, tuple[str | None, str]]] = {}
        # Per failing Module, the failure message its last Warning Event
        # gave; gone once a reconcile of the key goes through (the Module
        # recovered, or is gone).
        self._shown: dict[str, str] = {}
        # Per Module, the refusal each object's last Warning Event told.
        self._told = failures.Told()

    async def reconcile(self, key: str) -> controllers.Result:
        try:
            result = await self._reconcile(key)
        except Exception as err:
            if not failures.transient(err):
                await self._show_failure(key, failures.describe(err))
            raise  # the controller retries the key with its backoff
        self._shown.pop(key, None)
        return result

    async def _reconcile(self, key: str) -> controllers.Result:
        raw = self.caches.modules.get(key)
        if raw is None:
            # Normally the finalizer cleaned up; labels left behind (the
            # finalizer removed by hand, a crash between the two) go now.
            self._status_written.pop(key, None)
            self._versions.pop(key, None)
            self._refused.pop(key, None)
            self._told.forget(key)
            if self.admission is not None:
                self.admission.forget(key)
            if self.build is not None:
                self.build.forget_module(key)
            namespace, _, name = key.partition("/")
            await self._remove_labels(namespace, name)
            await self._remove_device_classes(key, None)
            return controllers.Result()
        metadata = raw["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        finalizers: list[str] = list(metadata.get("finalizers") or ())
        if metadata.get("deletionTimestamp"):
            await self._clean_up(raw, namespace, name, finalizers)
            return controllers.Result()
        if labels.FINALIZER not in finalizers:
            with failures.step("adding the finalizer"):
                await self.writer.set_finalizers(raw, [*finalizers, labels.FINALIZER])
        try:
            module = validation.parse_module(raw)
        except validation.InvalidModuleError as err:
            await self._refuse(raw, str(err))
            return controllers.Result()

        with failures.step("reading the caches"):
            view = self._view(raw, module, key)
        building = await self._plan_build(view)
        asked = _ask_planners(view, gated=building.gated, pins=building.digests)
        concerns = asked.concerns()
        # Refused writes (each one object's) do not stop the others.
        building, refused = await self._send_build(raw, view, building)
        refused += await self._send_daemonsets(
            raw, key, [ds for plan in concerns for ds in plan.apply]
        )
        await self._delete_daemonsets(raw, [name for plan in concerns for name in plan.delete])
        await self._replace_loader_pods(raw, asked.loader.replace)
        problems, retried = await self._send_device_classes(raw, key, view, asked.driver)
        refused += retried
        with failures.step("merging the node labels"):
            changes = nodelabels.merge(view.nodes(), concerns)
        await self._patch_labels(changes, view)
        if asked.loader.versions:
            self._versions.setdefault(key, {}).update(asked.loader.versions)
        admitted = await self._check_pods(raw, key, view)

        with failures.step("computing the status"):
            seen = _observed(
                module, view, asked.loader, asked.plugin, asked.driver,
                [*refused, *admitted.refused.values(), *building.problems, *problems],
            )  # fmt: skip
            seen = dataclasses.replace(
                seen,
                images=building.images,
                image_rebuild_trigger_generation=self._trigger_generation(view, building),
            )
            new = status.compute(raw, seen, now=self.now())
        # Refused: asked again with the key's backoff (a quota freed, a
        # policy changed, a server error gone send the Module no event).
        later = controllers.Result(
            requeue=bool(refused),
            requeue_after=_soonest(building.requeue_after, admitted.requeue_after),
        )
        if not status.differs(raw, new):
            return later
        if status.only_progress(raw, new):
            wait = self._status_written.get(key, -1e9) + self.status_interval - self.monotonic()
            if wait > 0:
                return controllers.Result(
                    requeue=later.requeue, requeue_after=_soonest(wait, later.requeue_after)
                )
        with failures.step("writing the status"):
            written = await self.writer.patch_module_status(raw, status.patch_body(new))
        if written:
            self._status_written[key] = self.monotonic()
        return later

    async def _plan_build(self, view: views.ModuleView) -> build_planner.BuildPlan:
        """What the build concern wants; an empty plan when it is not wired."""
        if self.build is None:
            return build_planner.BuildPlan()
        with failures.step("planning the image builds"):
            # The loader groups the nodes again; only Modules that build pay twice.
            builds = build_planner.module_builds(view.module)
            targets = loader_planner.grouping(view).targets if builds else {}
            return await self.build.plan(view, targets)

    def _trigger_generation(
        self, view: views.ModuleView, building: build_planner.BuildPlan
    ) -> int | None:
        if self.build is None:
            found = view.module.status
            return found.image_rebuild_trigger_generation if found is not None else None
        return self.build.trigger_generation(view, building)

    async def _send_build(
        self, raw: RawObject, view: views.ModuleView, building: build_planner.BuildPlan
    ) -> tuple[build_planner.BuildPlan, list[status.Problem]]:
        """Delete the pods the build planner is done with, create the ones it
        wants, then tell its Events (each once). A refused create is its
        kernel's: the plan comes back with that image failed, and the refusal."""
        if self.build is None or not (building.concerned or building.delete):
            return building, []
        key = f"{view.namespace}/{view.name}"
        refused: list[status.Problem] = []
        for pod in building.delete:
            name = pod["metadata"]["name"]
            with failures.step(f"deleting pod {name}"):
                await self.writer.delete_pod(pod)
        for creation in building.create:
            name = creation.pod["metadata"]["name"]
            try:
                with failures.step(f"creating pod {name}"):
                    created = await self.writer.create_pod(creation.pod)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = f"the API server refused pod {name}: {failures.refusal(err)}"
                refused.append(status.Problem(conditions.REASON_POD_REFUSED, message))
                building = _image_refused(building, creation.pod, message)
                await self._tell(raw, key, f"Pod/{name}", conditions.REASON_POD_REFUSED, message)
                continue
            self._told.settled(key, f"Pod/{name}")
            if created:
                event = creation.event
                await self._event(raw, event.type, event.reason, event.message)
        for event in building.events:
            await self._event(raw, event.type, event.reason, event.message)
        self.build.done(view, building)
        return building, refused

    async def _replace_loader_pods(self, raw: RawObject, found: list[RawObject]) -> None:
        """Delete loader pods of an older image that never loaded (``loader.planner``)."""
        for pod in found:
            name = pod["metadata"]["name"]
            with failures.step(f"deleting pod {name}"):
                deleted = await self.writer.delete_pod(pod)
            if deleted:
                node = (pod.get("spec") or {}).get("nodeName") or "no node yet"
                message = (
                    f"deleted loader pod {name} ({node}): it never loaded and runs an older image"
                )
                await self._event(raw, "Normal", "LoaderPodReplaced", message)

    async def _tell(self, raw: RawObject, key: str, what: str, reason: str, message: str) -> None:
        """A Warning Event for a refusal of ``what``, unless it told this one last."""
        if self._told.news(key, what, message):
            await self._event(raw, "Warning", reason, message)

    async def _check_pods(
        self, raw: RawObject, key: str, view: views.ModuleView
    ) -> podadmission.Checked:
        """Whether admission lets in the pods of the Module's DaemonSets."""
        if self.admission is None:
            return podadmission.Checked()
        found = [ds for group in view.daemonsets.values() for ds in group]
        checked = await self.admission.refusals(key, found)
        for name, problem in checked.refused.items():
            await self._tell(raw, key, f"Pods/{name}", problem.reason, problem.message)
        return checked

    async def _show_failure(self, key: str, message: str) -> None:
        """Degraded with ``message``, and a Warning Event unless it is the one
        shown last. Best effort: the failure itself is raised on and retried."""
        raw = self.caches.modules.get(key)
        if raw is None:
            return
        new = status.failed(raw, message, now=self.now())
        if status.differs(raw, new):
            try:
                await self.writer.patch_module_status(raw, status.patch_body(new))
            except Exception as err:
                _log.warning("%s: status not written: %s", key, err)
        if self._shown.get(key) == message:
            return
        self._shown[key] = message
        try:
            await self._event(raw, "Warning", conditions.REASON_RECONCILE_FAILED, message)
        except Exception as err:
            _log.warning("%s: event not written: %s", key, err)

    def _view(self, raw: RawObject, module: modules.Module, key: str) -> views.ModuleView:
        """What counts as the Module's in the caches (``ownership.owned``: by
        namespace and owners, never by labels alone)."""
        cached = self.caches
        ours = ownership.owned(raw, daemonsets=cached.daemonsets, pods=cached.pods)
        classes: dict[str, RawObject] = {
            c["metadata"]["name"]: c for c in self._own_device_classes(raw, key)
        }
        claims: list[RawObject] = []
        if module.spec.dra is not None:
            for listed in module.spec.dra.device_classes or ():
                found = cached.device_classes.get(listed.name)
                if found is not None:
                    classes[listed.name] = found
            claims = cached.claims.by_index(caches.DRIVER_INDEX, module.spec.dra.driver_name)
        return views.build(
            raw,
            module,
            nodes=cached.nodes,
            daemonsets=ours.daemonsets,
            pods=ours.pods,
            labelled=cached.nodes.by_index(caches.MODULE_INDEX, key),
            device_classes=classes.values(),
            claims=claims,
            resource_api=cached.resource_api,
        )

    async def _send_device_classes(
        self, raw: RawObject, key: str, view: views.ModuleView, plan: dra_planner.DraPlan
    ) -> tuple[list[status.Problem], list[status.Problem]]:
        """Create, update and delete the Module's DeviceClasses; what stands in
        the way, and the refusals to retry with backoff (forbidden, or the
        server's error: an invalid class is not sent again until it changes)."""
        problems: list[status.Problem] = []
        retried: list[status.Problem] = []
        if plan.enabled and not view.resource_api:
            problems.append(
                status.Problem(
                    conditions.REASON_RESOURCE_API_UNAVAILABLE,
                    "the cluster does not serve resource.k8s.io/v1 (DRA): no DeviceClass "
                    "can be made and no claim allocated; restart the operator once it does",
                )
            )
            return problems, retried
        refused = self._refused.setdefault(key, {})
        for name in plan.classes_delete:
            refused.pop(name, None)
            observed = view.device_classes.get(name)
            if observed is None:
                continue  # never observed: nothing of ours to delete
            with failures.step(f"deleting DeviceClass {name}"):
                deleted = await self.writer.delete_device_class(name, observed)
            if deleted:
                await self._event(
                    raw, "Normal", "DeviceClassDeleted", f"deleted DeviceClass {name}"
                )
        listed = {c["metadata"]["name"] for c in plan.classes_apply} | set(plan.conflicts)
        for name in [n for n in refused if n not in listed]:
            del refused[name]  # fixed, or no longer listed
        for desired in plan.classes_apply:
            name = desired["metadata"]["name"]
            digest = objects.observed_hash(desired)
            if name in refused and refused[name][0] == digest:
                problems.append(
                    status.Problem(conditions.REASON_DEVICE_CLASS_REFUSED, refused[name][1])
                )
                continue
            observed = view.device_classes.get(name)
            # A refusal is this class's problem: an invalid class is not
            # sent again until it changes; any other refusal is retried with
            # the key's backoff. Any other failure ends the reconcile.
            try:
                with failures.step(f"sending DeviceClass {name}"):
                    if observed is None:
                        if await self.writer.create_device_class(desired):
                            created = f"created DeviceClass {name}"
                            await self._event(raw, "Normal", "DeviceClassCreated", created)
                    else:
                        await self.writer.apply_device_class(desired, observed)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = (
                    f"{_class_field(view, name)}: the API server refused DeviceClass {name}: "
                    f"{failures.refusal(err)}"
                )
                problem = status.Problem(conditions.REASON_DEVICE_CLASS_REFUSED, message)
                cause = err.cause if isinstance(err, failures.StepFailed) else err
                if isinstance(cause, errors.Invalid):
                    refused[name] = (digest, message)
                    problems.append(problem)
                else:
                    retried.append(problem)
                await self._tell(raw, key, f"DeviceClass/{name}", problem.reason, message)
                continue
            refused.pop(name, None)
            self._told.settled(key, f"DeviceClass/{name}")
        for name, why in sorted(plan.conflicts.items()):
            problems.append(
                status.Problem(
                    conditions.REASON_DEVICE_CLASS_CONFLICT, f"{_class_field(view, name)}: {why}"
                )
            )
        if not refused:
            self._refused.pop(key, None)
        return problems, retried

    def _own_device_classes(self, raw: RawObject, key: str) -> list[RawObject]:
        """The cached DeviceClasses that are the Module's (its labels and uid)."""
        metadata = raw["metadata"]
        return [
            c
            for c in self.caches.device_classes.by_index(caches.MODULE_INDEX, key)
            if ownership.class_owned(
                c, namespace=metadata["namespace"], name=metadata["name"], uid=metadata.get("uid")
            )
        ]

    async def _remove_device_classes(self, key: str, raw: RawObject | None) -> None:
        """Delete the Module's DeviceClasses, each guarded by its observed uid.
        ``raw`` None: the Module is gone from the cache (its finalizer
        removed by hand), its uid unknown: the classes labelled for it that
        carry a uid label go (kmm stamped them; no live Module has that
        key); unstamped ones are left, as they are never deleted."""
        if raw is not None:
            found = self._own_device_classes(raw, key)
        else:
            found = [
                c
                for c in self.caches.device_classes.by_index(caches.MODULE_INDEX, key)
                if labels.MODULE_UID in (c["metadata"].get("labels") or {})
            ]
        for observed in found:
            name = observed["metadata"]["name"]
            with failures.step(f"deleting DeviceClass {name}"):
                await self.writer.delete_device_class(name, observed)

    async def _send_daemonsets(
        self, raw: RawObject, key: str, desired: list[RawObject]
    ) -> list[status.Problem]:
        """Apply each DaemonSet; the refusals, each the Module's problem."""
        namespace = raw["metadata"]["namespace"]
        refused: list[status.Problem] = []
        for obj in desired:
            ds_name = obj["metadata"]["name"]
            observed = self.caches.daemonsets.get(f"{namespace}/{ds_name}")
            try:
                with failures.step(f"applying DaemonSet {ds_name}"):
                    created = await self.writer.apply_daemonset(obj, observed)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = f"the API server refused DaemonSet {ds_name}: {failures.refusal(err)}"
                refused.append(status.Problem(conditions.REASON_DAEMONSET_REFUSED, message))
                what = f"DaemonSet/{ds_name}"
                await self._tell(raw, key, what, conditions.REASON_DAEMONSET_REFUSED, message)
                continue
            self._told.settled(key, f"DaemonSet/{ds_name}")
            if created:
                await self._event(raw, "Normal", "DaemonSetCreated", f"created DaemonSet {ds_name}")
        return refused

    async def _delete_daemonsets(self, raw: RawObject, names: list[str]) -> None:
        """Delete the Module's DaemonSets of ``names``, each guarded by its
        observed uid. A name that is no DaemonSet of the Module's in the
        cache (``ownership.owned``) is nothing to delete: never one of that
        name someone else has in the Module's namespace."""
        namespace = raw["metadata"]["namespace"]
        ours = {
            ds["metadata"]["name"]: ds
            for ds in ownership.module_daemonsets(raw, self.caches.daemonsets)
        }
        for ds_name in names:
            observed = ours.get(ds_name)
            if observed is None:
                _log.warning(
                    "%s: DaemonSet %s is not the Module's: not deleted", namespace, ds_name
                )
                continue
            with failures.step(f"deleting DaemonSet {ds_name}"):
                deleted = await self.writer.delete_daemonset(observed)
            if deleted:
                await self._event(raw, "Normal", "DaemonSetDeleted", f"deleted DaemonSet {ds_name}")

    async def _refuse(self, raw: RawObject, message: str) -> None:
        new = status.invalid(raw, message, now=self.now())
        if not status.differs(raw, new):
            return
        # One Event per refusal: a reconcile in the cache gap (the status
        # write not seen yet) finds the same patch in flight and says nothing.
        with failures.step("writing the status"):
            written = await self.writer.patch_module_status(raw, status.patch_body(new))
        if written:
            await self._event(raw, "Warning", "InvalidSpec", message)

    async def _clean_up(
        self, raw: RawObject, namespace: str, name: str, finalizers: list[str]
    ) -> None:
        if labels.FINALIZER not in finalizers:
            return
        if await self._pods_still_going(raw):
            return  # their deletions requeue the Module
        await self._remove_labels(namespace, name)
        await self._remove_device_classes(f"{namespace}/{name}", raw)
        with failures.step("removing the finalizer"):
            await self.writer.set_finalizers(raw, [f for f in finalizers if f != labels.FINALIZER])

    async def _pods_still_going(self, raw: RawObject) -> bool:
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
            ours = ownership.owned(raw, daemonsets=self.caches.daemonsets, pods=self.caches.pods)
            stage = [
                obj
                for obj in ours.daemonsets
                if _role(obj) in roles and not obj["metadata"].get("deletionTimestamp")
            ]
            await self._delete_daemonsets(raw, sorted(obj["metadata"]["name"] for obj in stage))
            if any(_role(pod) in roles for pod in ours.pods):
                return True
        return False

    async def _remove_labels(self, namespace: str, name: str) -> None:
        """Every label the operator put on nodes for the Module (the user's own
        version label stays: it is the user's)."""
        labelled = self.caches.nodes.by_index(caches.MODULE_INDEX, f"{namespace}/{name}")
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
        await self._patch_labels(changes, None)

    async def _patch_labels(
        self, changes: nodelabels.LabelChanges, view: views.ModuleView | None
    ) -> None:
        """One patch per node, ``_PARALLEL_WRITES`` at a time. Once one fails
        transiently (no answer, throttled, fenced) no more are started: the
        others would meet the same outage, and the key's backoff retries
        them all, so an outage costs at most the patches already in flight
        per retry, not one per node."""
        limit = asyncio.Semaphore(_PARALLEL_WRITES)
        outage = asyncio.Event()

        async def one(node_name: str, change: dict[str, str | None]) -> None:
            async with limit:
                if outage.is_set():
                    return
                # The view is as old as the reconcile; another reconcile's
                # write may have landed since (DESIGN §5: no repeated writes).
                node = self.caches.nodes.get(node_name)
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
        await self.writer.create_event(
            events.node_event(
                node,
                reason="ModuleLoaded" if loaded else "ModuleUnloaded",
                message=f"{what} {'loaded' if loaded else 'unloaded'}",
                now=self.now(),
                instance=self.instance,
            )
        )

    async def _event(
        self, raw: RawObject, type_: Literal["Normal", "Warning"], reason: str, message: str
    ) -> None:
        await self.writer.create_event(
            events.event(
                raw,
                type_=type_,
                reason=reason,
                message=message,
                now=self.now(),
                instance=self.instance,
            )
        )


@dataclasses.dataclass(frozen=True)
class _Asked:
    """Each concern's answer for one view (step 3)."""

    loader: loader_planner.LoaderPlan
    plugin: deviceplugin_planner.PluginPlan
    driver: dra_planner.DraPlan
    upgrade: upgrade_planner.UpgradePlan

    def concerns(self) -> tuple[plans.Plan, ...]:
        """Every answer, in the order the planners were asked."""
        return (self.loader, self.plugin, self.driver, self.upgrade)


def _ask_planners(
    view: views.ModuleView,
    *,
    gated: Collection[str] = frozenset(),
    pins: Mapping[str, str] | None = None,
) -> _Asked:
    """Ask each concern's planner, in the order their answers feed each
    other: the loader first (where the module is loaded), the two device
    workloads (which run there), then the ordered upgrade (with whichever
    device workload the Module has). Each call is a named step, so a
    planner's bug shows on the Module as that step."""
    with failures.step("planning the module loader"):
        loader = loader_planner.plan(view, gated=gated, pins=pins)
    with failures.step("planning the device plugin"):
        plugin = deviceplugin_planner.plan(view, loader)
    with failures.step("planning the DRA driver"):
        driver = dra_planner.plan(view, loader)
    devices = driver if driver.enabled else plugin
    with failures.step("planning the ordered upgrade"):
        moving = upgrade_planner.plan(view, loader, devices)
    return _Asked(loader=loader, plugin=plugin, driver=driver, upgrade=moving)


def _role(obj: RawObject) -> str:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(labels.ROLE)
    return value if isinstance(value, str) else ""


def _observed(
    module: modules.Module,
    view: views.ModuleView,
    loader: loader_planner.LoaderPlan,
    plugin: deviceplugin_planner.PluginPlan,
    driver: dra_planner.DraPlan,
    problems: list[status.Problem],
) -> status.Observed:
    """What the reconcile saw, for ``status.compute``."""
    versioned = view.version is not None
    selected = len(view.selected)
    devices = driver if driver.enabled else plugin
    return status.Observed(
        selected=selected,
        loader=status.counts(selected, loader.current, versioned=versioned)
        if module.spec.module_loader is not None
        else None,
        plugin=status.counts(len(plugin.wanted), plugin.current, versioned=versioned)
        if plugin.enabled
        else None,
        dra=status.counts(len(driver.wanted), driver.current, versioned=versioned)
        if driver.enabled
        else None,
        targeted=len(loader.targeted),
        ready=len(loader.loaded),
        plugin_wanted=len(devices.wanted),
        plugin_ready=len(devices.ready & devices.wanted),
        mapping_errors=loader.grouping.errors,
        devices="DRA drivers" if driver.enabled else "device plugins",
        problems=problems,
    )


def _soonest(*delays: float | None) -> float | None:
    """The shortest of the delays given, None if none is."""
    given = [d for d in delays if d is not None]
    return min(given) if given else None


def _image_refused(
    building: build_planner.BuildPlan, pod: RawObject, message: str
) -> build_planner.BuildPlan:
    """``building`` with the image the refused ``pod`` was to make failed."""
    name = pod["metadata"]["name"]
    role = _role(pod)
    failed: modules.ImageState = (
        "SignFailed"
        if role == "sign"
        else "Checking"
        if role == labels.PULL_ROLE
        else "BuildFailed"
    )
    images = [
        image.model_copy(update={"state": failed, "pod": None, "message": message})
        if image.pod == name
        else image
        for image in building.images
    ]
    return dataclasses.replace(building, images=images)


def _class_field(view: views.ModuleView, name: str) -> str:
    """The spec path of the listed DeviceClass ``name``."""
    listed = view.module.spec.dra.device_classes if view.module.spec.dra is not None else None
    for index, declared in enumerate(listed or ()):
        if declared.name == name:
            return f"spec.dra.deviceClasses[{index}]"
    return "spec.dra.deviceClasses"


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Run writes concurrently; every one finishes before the first error is raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
