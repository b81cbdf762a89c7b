"""The DRA kubelet plugin: lifecycle, claims, errors (seed 004's ``Plugin``).

``Plugin.start`` loads the checkpoint (a corrupted one stops the start with
``CheckpointCorruptedError``), lets the policy relearn what is prepared,
starts the claim source, brings the DRA socket up and only then the
registration socket (the kubelet connects to the DRA endpoint as soon as it
sees the registration), and starts publishing. ``stop`` undoes it in reverse:
registration first, then the DRA server, which waits for requests in flight.
Both are idempotent.

Lock order: every kubelet request takes ``owner.lock`` around its claim
work (ResourceClaims are fetched before, so no API call is made under it).
``stop`` must therefore never run under that lock: it waits for the request
that holds it (seed 001, "Stop() stops the plugin before taking the lock").

Prepare, per call: refuse everything until ``allow_claims``; validate each
claim reference (a bad UID or name fails that claim alone); answer claims
already prepared from the checkpoint (rebuilding a lost CDI spec); record
the rest as started (one checkpoint write), let the policy prepare each,
write their CDI specs (in parallel worker threads: separate files), commit
each through ``owner.claim_allocated``, and record them completed (a second
write). A failing claim is undone and answered with its error; the others
are unaffected. File I/O runs in worker threads so health streams and the
publisher keep running during a large prepare.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pathlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from kmm.aio import tasks
from kmm.kube import client
from kmm.kubeletplugin import (
    cdi,
    checkpointing,
    claimcache,
    claims,
    errors,
    files,
    owners,
    publishing,
    serving,
)

__all__ = ["Paths", "Plugin", "PrepareResult", "driver_name"]

logger = logging.getLogger(__name__)

V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH = "v1alpha1.DRAResourceHealth"
KUBELET_TIMEOUT = 45.0


def driver_name(policy_name: str) -> claims.DriverName:
    """The DRA driver name of a policy: a DNS subdomain under kmm's API group."""
    return claims.DriverName(f"{policy_name}.kmm.sigs.x-k8s.io")


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the plugin's files live on the node."""

    registrar_dir: pathlib.Path
    plugin_data_dir: pathlib.Path
    cdi_dir: pathlib.Path

    @classmethod
    def under(cls, root: pathlib.Path, driver: str) -> Paths:
        """The kubelet's standard layout below ``root`` ("/" on a real node)."""
        return cls(
            registrar_dir=root / "var/lib/kubelet/plugins_registry",
            plugin_data_dir=root / "var/lib/kubelet/plugins" / driver,
            cdi_dir=root / "var/run/cdi",
        )

    def registration_socket(self, driver: str) -> pathlib.Path:
        return self.registrar_dir / f"{driver}-reg.sock"

    @property
    def dra_socket(self) -> pathlib.Path:
        return self.plugin_data_dir / "dra.sock"


@dataclasses.dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: its devices, or an error."""

    devices: tuple[checkpointing.PreparedDevice, ...] = ()
    error: str = ""


class Plugin:
    """A DRA kubelet plugin serving one driver on one node."""

    def __init__(
        self,
        driver: str,
        *,
        node: str,
        owner: owners.Owner,
        policy: owners.Policy,
        claim_source: claimcache.ClaimSource,
        paths: Paths,
        api: client.Client | None = None,
        stop_grace: float = KUBELET_TIMEOUT,
        crash_point: Callable[[str], None] | None = None,
    ) -> None:
        cdi.validate_vendor(driver)
        self.driver = claims.DriverName(driver)
        self.node = claims.NodeName(node)
        self.paths = paths
        self._owner = owner
        self._policy = policy
        self._claims = claim_source
        self._stop_grace = stop_grace
        # Test seam: called at named points so a test can kill the process there.
        self._crash_point = crash_point or (lambda _point: None)
        self._specs = cdi.SpecDir(paths.cdi_dir, vendor=driver)
        self.checkpoint = checkpointing.Checkpoint(paths.plugin_data_dir)
        self._publisher = (
            publishing.Publisher(
                api, driver=self.driver, node=self.node, on_error=self.handle_error
            )
            if api is not None
            else None
        )
        self._devices: list[publishing.Device] = []
        self._allowed = False
        self._serve_health = False
        self._started = False
        self._lifecycle = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._dra: serving.Server | None = None
        self._registration: serving.Server | None = None
        self._publish_task: asyncio.Task[None] | None = None
        self.registered = asyncio.Event()
        self.registration_error = ""

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Serve the kubelet; a second call does nothing."""
        async with self._lifecycle:
            if self._started:
                return
            self.checkpoint.load()
            self._policy.restore(
                {
                    uid: record.devices
                    for uid, record in self.checkpoint.claims.items()
                    if record.state == checkpointing.COMPLETED
                }
            )
            files.ensure_dir(self.paths.plugin_data_dir)
            files.ensure_dir(self.paths.registrar_dir)
            self._serve_health = self._policy.health_supported()
            self._stopping.clear()
            await self._claims.start()
            try:
                dra = serving.Server(self.paths.dra_socket)
                self._dra = dra
                serving.add_dra_services(
                    dra.server, self, stopping=self._stopping, health=self._serve_health
                )
                await dra.start()
                registration = serving.Server(self.paths.registration_socket(self.driver))
                self._registration = registration
                serving.add_registration_service(registration.server, self)
                await registration.start()
            except BaseException:
                # Half a start would leave a socket the kubelet can find but
                # nobody to stop it: undo what did come up.
                await self._shutdown(grace=0)
                raise
            if self._publisher is not None:
                self._publisher.publish(self._devices)
                self._publish_task = tasks.guard(
                    self._publisher.run(),
                    name="resourceslice-publisher",
                    on_error=self.handle_error,
                )
            self._started = True
            logger.info("DRA plugin %s started on node %s", self.driver, self.node)

    async def stop(self) -> None:
        """Unregister and stop serving; waits for requests in flight.

        Never call this holding ``owner.lock``: a request in flight holds it.
        """
        async with self._lifecycle:
            if not self._started:
                return
            self._started = False
            await self._shutdown(grace=self._stop_grace)
            logger.info("DRA plugin %s stopped", self.driver)

    async def _shutdown(self, *, grace: float) -> None:
        self._stopping.set()  # ends health streams, which would hold the drain
        registration, self._registration = self._registration, None
        if registration is not None:
            await registration.stop(0)
        dra, self._dra = self._dra, None
        if dra is not None:
            await dra.stop(grace)
        task, self._publish_task = self._publish_task, None
        await tasks.cancel(task)
        await self._claims.stop()

    @property
    def started(self) -> bool:
        return self._started

    def allow_claims(self) -> None:
        """Let the plugin serve claims; the owner calls it once it has synchronized."""
        self._allowed = True

    # -- errors and publishing -------------------------------------------

    def handle_error(self, error: BaseException, message: str) -> None:
        """Log recoverable background errors; ask the owner to shut down on the rest."""
        if isinstance(error, errors.RecoverableError):
            logger.warning("%s (will retry): %s", message, error)
            return
        logger.error("%s: %s", message, error)
        self._owner.request_shutdown(f"{message}: {error}")

    def publish(self, devices: Sequence[publishing.Device]) -> None:
        """Replace the published devices; before ``start`` they wait for it."""
        self._devices = list(devices)
        if self._started and self._publisher is not None:
            self._publisher.publish(self._devices)

    @property
    def publisher(self) -> publishing.Publisher | None:
        return self._publisher

    def list_attributes_supported(self) -> bool:
        """Whether device attributes may hold lists of values.

        ``resource.k8s.io/v1`` has only scalar attributes, and without an API
        client DRA is off; policies ask instead of assuming.
        """
        return False

    # -- serving.Handler ---------------------------------------------------

    def plugin_info(self) -> tuple[str, list[str]]:
        versions = [V1, V1BETA1] + ([HEALTH] if self._serve_health else [])
        return str(self.paths.dra_socket.absolute()), versions

    def registration_status(self, registered: bool, error: str) -> None:
        self.registration_error = error
        if registered:
            self.registered.set()
            logger.info("registered with the kubelet")
        else:
            self.registered.clear()
            logger.error("the kubelet refused the registration: %s", error)

    def health_supported(self) -> bool:
        return self._serve_health

    def watch_health(self) -> AsyncIterator[Sequence[owners.DeviceHealthReport]]:
        return self._policy.watch_health()

    async def node_prepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, PrepareResult]:
        """The kubelet's NodePrepareResources: fetch claims, then prepare them."""
        answers: dict[str, PrepareResult] = {}
        unique = list({ref.uid: ref for ref in refs}.values())
        if not self._allowed:
            return {ref.uid: PrepareResult(error=_not_allowed()) for ref in unique}
        valid: list[claims.ClaimRef] = []
        for ref in unique:
            try:
                claims.validate_ref(ref)
            except errors.ClaimError as err:
                answers[ref.uid] = PrepareResult(error=str(err))
            else:
                valid.append(ref)
        fetched = await asyncio.gather(
            *(self._claims.get(ref) for ref in valid), return_exceptions=True
        )
        found: list[claims.ResourceClaim] = []
        for ref, claim in zip(valid, fetched, strict=True):
            if isinstance(claim, BaseException):
                if not isinstance(claim, Exception):
                    raise claim
                answers[ref.uid] = PrepareResult(error=f"cannot get claim: {claim}")
            else:
                found.append(claim)
        answers.update(await self.prepare_resource_claims(found))
        return answers

    async def node_unprepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, str]:
        """The kubelet's NodeUnprepareResources: errors by claim UID ("" = done)."""
        unique = list({ref.uid: ref for ref in refs}.values())
        if not self._allowed:
            return {ref.uid: _not_allowed() for ref in unique}
        results = await self.unprepare_resource_claims(unique)
        return {uid: "" if error is None else str(error) for uid, error in results.items()}

    # -- claims --------------------------------------------------------------

    async def prepare_resource_claims(
        self, resource_claims: Sequence[claims.ResourceClaim]
    ) -> dict[str, PrepareResult]:
        """Prepare each claim on its own under the owner's lock."""
        answers: dict[str, PrepareResult] = {}
        async with self._owner.lock:
            todo: list[claims.ResourceClaim] = []
            for claim in resource_claims:
                ref = claims.ref_of(claim)
                try:
                    claims.validate_ref(ref)
                    record = self.checkpoint.claims.get(ref.uid)
                    if record is not None and record.state == checkpointing.COMPLETED:
                        answers[ref.uid] = self._answer_prepared(ref.uid, record)
                    else:
                        todo.append(claim)
                except errors.PluginError as err:
                    answers[ref.uid] = PrepareResult(error=str(err))
            if not todo:
                return answers
            for claim in todo:
                ref = claims.ref_of(claim)
                self.checkpoint.claims[ref.uid] = checkpointing.ClaimRecord(
                    namespace=ref.namespace, name=ref.name, state=checkpointing.STARTED
                )
            try:
                await asyncio.to_thread(self.checkpoint.save)
            except errors.CheckpointError as err:
                for claim in todo:
                    uid = claims.ref_of(claim).uid
                    del self.checkpoint.claims[uid]
                    answers[uid] = PrepareResult(error=str(err))
                return answers
            staged: list[tuple[claims.ClaimRef, list[owners.DeviceAllocation]]] = []
            for claim in todo:
                ref = claims.ref_of(claim)
                try:
                    staged.append((ref, await self._allocate(ref, claim)))
                except Exception as err:
                    await self._fail(answers, ref, err)
            # The CDI specs are independent files: written in parallel threads,
            # their fsyncs share journal commits and the event loop stays free.
            written = await asyncio.gather(
                *(asyncio.to_thread(self._write_spec, ref.uid, allocs) for ref, allocs in staged),
                return_exceptions=True,
            )
            done: list[claims.ClaimRef] = []
            for (ref, allocations), ids in zip(staged, written, strict=True):
                if isinstance(ids, BaseException):
                    if not isinstance(ids, Exception):
                        raise ids
                    await self._fail(answers, ref, ids)
                    continue
                self._crash_point("cdi-written")
                try:
                    await self._owner.claim_allocated(ref)
                except Exception as err:
                    await self._fail(answers, ref, err)
                    continue
                devices = tuple(
                    checkpointing.PreparedDevice(
                        request_names=a.request_names,
                        pool_name=a.pool_name,
                        device_name=a.device_name,
                        cdi_device_ids=(ids[i],),
                        edits=a.edits,
                    )
                    for i, a in enumerate(allocations)
                )
                self.checkpoint.claims[ref.uid] = checkpointing.ClaimRecord(
                    namespace=ref.namespace,
                    name=ref.name,
                    state=checkpointing.COMPLETED,
                    devices=devices,
                )
                answers[ref.uid] = PrepareResult(devices=devices)
                done.append(ref)
            self._crash_point("before-checkpoint-completed")
            try:
                await asyncio.to_thread(self.checkpoint.save)
            except errors.CheckpointError as err:
                # The file still says "started"; a retry redoes these claims.
                for ref in done:
                    answers[ref.uid] = PrepareResult(error=str(err))
        return answers

    async def _allocate(
        self, ref: claims.ClaimRef, claim: claims.ResourceClaim
    ) -> list[owners.DeviceAllocation]:
        if not claims.is_allocated(claim):
            raise errors.ClaimError(f"claim {ref.namespace}/{ref.name} is not allocated")
        results = claims.driver_results(claim, self.driver)
        preparing = owners.PreparingClaim(
            ref=ref,
            results=tuple(results),
            configs=tuple(claims.claim_configs(claim, self.driver)),
        )
        allocations = list(await self._policy.prepare(preparing))
        if len(allocations) != len(results):
            raise errors.ClaimError(
                f"policy prepared {len(allocations)} devices for {len(results)} results"
            )
        return allocations

    def _write_spec(
        self, uid: claims.ClaimUID, allocations: Sequence[owners.DeviceAllocation]
    ) -> list[str]:
        if not allocations:
            return []
        return self._specs.write(uid, [a.edits for a in allocations])

    async def _fail(
        self, answers: dict[str, PrepareResult], ref: claims.ClaimRef, err: Exception
    ) -> None:
        logger.warning("preparing claim %s/%s failed: %s", ref.namespace, ref.name, err)
        answers[ref.uid] = PrepareResult(error=str(err) or type(err).__name__)
        await self._undo(ref.uid)

    def _answer_prepared(
        self, uid: claims.ClaimUID, record: checkpointing.ClaimRecord
    ) -> PrepareResult:
        # A reboot empties /var/run/cdi while the checkpoint survives: rebuild.
        if record.devices and not self._specs.exists(uid):
            self._specs.write(uid, [device.edits for device in record.devices])
        return PrepareResult(devices=record.devices)

    async def _undo(self, uid: claims.ClaimUID) -> None:
        try:
            await self._policy.unprepare(uid)
            self._specs.remove(uid)
        except Exception as err:
            logger.error("undoing claim %s failed: %s", uid, err)
        self.checkpoint.claims.pop(uid, None)

    async def unprepare_resource_claims(
        self, refs: Sequence[claims.ClaimRef]
    ) -> dict[str, Exception | None]:
        """Release each claim on its own; an unknown claim succeeds."""
        results: dict[str, Exception | None] = {}
        async with self._owner.lock:
            changed = False
            for ref in refs:
                try:
                    claims.validate_ref(ref)
                    if ref.uid not in self.checkpoint.claims:
                        self._specs.remove(ref.uid)
                        results[ref.uid] = None
                        continue
                    await self._policy.unprepare(ref.uid)
                    self._specs.remove(ref.uid)
                    await self._owner.claim_released(ref)
                    del self.checkpoint.claims[ref.uid]
                    changed = True
                    results[ref.uid] = None
                except Exception as err:
                    results[ref.uid] = err
            if changed:
                try:
                    await asyncio.to_thread(self.checkpoint.save)
                except errors.CheckpointError as err:
                    for uid, error in results.items():
                        if error is None:
                            results[uid] = err
        return results

    def prepared(self) -> Mapping[claims.ClaimUID, checkpointing.ClaimRecord]:
        return dict(self.checkpoint.claims)


def _not_allowed() -> str:
    return str(errors.NotAllowedError("claims are not served yet: the owner is synchronizing"))
