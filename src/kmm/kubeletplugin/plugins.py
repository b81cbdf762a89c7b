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
already prepared from the checkpoint (rewriting a CDI spec a reboot or a
crash lost or tore); record the rest as started (one checkpoint write), let
the policy prepare each, write their CDI specs, commit each through
``owner.claim_allocated``, and record them completed (a second write). A
failing claim is undone and answered with its error; the others are
unaffected. Unprepare releases each claim, commits the checkpoint once,
then removes the specs.

An undo that fails (the policy's ``unprepare`` raised) leaves the policy
perhaps holding the claim's devices, so the claim is not forgotten: it is
recorded ``ReleasePending`` (checkpointed, so a restart keeps it) and never
answered as prepared. The kubelet's NodeUnprepareResources for it (which
comes: the kubelet checkpointed the claim before its prepare call) releases
it and forgets it, as any unprepare does; a NodePrepareResources for it,
the kubelet's retry, releases it first and only then prepares it afresh,
or answers the release's error and keeps it pending.

What is fsynced, per call: nothing. A call's checkpoint changes are lines
appended to the journal (one for "started", one for "completed", one for
an unprepare, one for an undo that failed; ``checkpointing``), and CDI
specs are written and removed without an fsync. A killed process loses none
of it: its writes are in the page cache. What a power loss or a kernel crash
loses does not matter, because the node reboots and every container goes
with it:
- after a reboot no claim prepared before it holds devices: the journal
  records the boot that began it (``boot_id``), every claim from an earlier
  boot is given back to the kubelet's next prepare as "started" (the
  kubelet prepares every claim again after a reboot, before any container
  starts) and none is handed to the policy's ``restore``. So neither a lost
  "started" or "completed" line nor an undone unprepare can make a claim
  answer stale devices or hold them;
- a torn end of the journal is told apart from damage by the boot: after a
  reboot it is dropped (and the old journal kept aside as
  ``checkpoint.journal.torn``), within one boot it can only be damage and is
  reported (``journaling``);
- a spec lost or torn is checked against the checkpoint's edits at the
  claim's next prepare and rewritten; a spec whose claim the checkpoint
  does not hold is removed at start.
What is fsynced is the snapshot and the empty journal that ``save`` writes,
at start and when the journal passes its limit (``checkpointing``): four
fsyncs, once per about 1,700 one-claim prepares and unprepares. A policy
whose ``prepare`` changes something a reboot keeps must keep its own
durable record of it (``owners.Policy``).
File I/O runs on the event loop, not in worker threads: a call blocks the
loop for one append and the claims' spec writes, while a hand-off to a
thread and back cost as much as a write it moved (0.85 ms against 0.73 ms,
measured on the 2-core test machine under load), twice per prepare. A disk
that stalls stalls the plugin's loop, and its gRPC liveness check with it,
which is what a kubelet should learn.
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

__all__ = ["Paths", "Plugin", "PrepareResult", "current_boot_id", "driver_name"]

logger = logging.getLogger(__name__)

V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH = "v1alpha1.DRAResourceHealth"
KUBELET_TIMEOUT = 45.0
# How long the API lookups of one call may wait, in all (claimcache).
LOOKUP_BUDGET = 1.0


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
        boot_id: str | None = None,
        on_registration: Callable[[bool], None] | None = None,
    ) -> None:
        cdi.validate_vendor(driver)
        self.driver = claims.DriverName(driver)
        self.node = claims.NodeName(node)
        self.paths = paths
        self._owner = owner
        self._policy = policy
        self._claims = claim_source
        self._stop_grace = stop_grace
        self._boot_id = boot_id if boot_id is not None else current_boot_id()
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
        # Told each registration status the kubelet sends (readiness).
        self._on_registration = on_registration or (lambda _registered: None)

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Serve the kubelet; a second call does nothing."""
        async with self._lifecycle:
            if self._started:
                return
            self._load_checkpoint()
            for orphan in self._specs.remove_others(self.checkpoint.claims):
                logger.info("removed CDI spec %s: its claim is not prepared", orphan)
            self._policy.restore(
                {
                    uid: record.devices
                    for uid, record in self.checkpoint.claims.items()
                    if record.state == checkpointing.COMPLETED
                }
            )
            self.checkpoint.save()  # a new snapshot and an empty journal, durably
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

    def _load_checkpoint(self) -> None:
        reading = self.checkpoint.load(boot_id=self._boot_id)
        if reading is not None and reading.torn:
            aside = self.checkpoint.journal.set_aside("torn")
            logger.warning(
                "the node rebooted before %d checkpoint changes reached the disk whole; "
                "they were dropped (the journal is kept as %s)",
                reading.dropped,
                aside,
            )
        elif reading is not None and reading.dropped:
            logger.info("dropped a checkpoint change a killed process did not finish writing")
        self._forget_previous_boot()

    def _forget_previous_boot(self) -> None:
        """After a reboot, claims prepared before it are prepared again when asked."""
        previous, self.checkpoint.boot_id = self.checkpoint.boot_id, self._boot_id
        if previous is None or previous == self._boot_id:
            return
        records = self.checkpoint.claims
        before = [uid for uid, record in records.items() if record.state == checkpointing.COMPLETED]
        for uid in before:
            records[uid] = dataclasses.replace(records[uid], state=checkpointing.STARTED)
        if before:
            logger.info(
                "the node rebooted since the checkpoint was written: %d prepared claims "
                "are prepared again when the kubelet asks",
                len(before),
            )

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
        self.checkpoint.close()

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
        self._on_registration(registered)

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
        # One at a time: a cached claim costs no task, and the claims a cache
        # misses are looked up one after another, within one budget of waiting.
        found: list[claims.ResourceClaim] = []
        budget = claimcache.LookupBudget(LOOKUP_BUDGET)
        for ref in valid:
            try:
                found.append(await self._claims.get(ref, budget=budget))
            except Exception as err:
                answers[ref.uid] = PrepareResult(error=f"cannot get claim: {err}")
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
                        continue
                    if record is not None and record.state == checkpointing.RELEASE_PENDING:
                        await self._retry_release(ref)
                    todo.append(claim)
                except errors.PluginError as err:
                    answers[ref.uid] = PrepareResult(error=str(err))
            if not todo:
                return answers
            started = {}
            for claim in todo:
                ref = claims.ref_of(claim)
                started[ref.uid] = checkpointing.ClaimRecord(
                    namespace=ref.namespace, name=ref.name, state=checkpointing.STARTED
                )
            try:
                self.checkpoint.commit(put=started)
            except errors.CheckpointError as err:
                for uid in started:
                    answers[uid] = PrepareResult(error=str(err))
                return answers
            staged: list[tuple[claims.ClaimRef, checkpointing.ClaimRecord]] = []
            for claim in todo:
                ref = claims.ref_of(claim)
                try:
                    allocations = await self._allocate(ref, claim)
                    ids = self._specs.device_ids(ref.uid, len(allocations))
                    await self._owner.claim_allocated(ref)
                except Exception as err:
                    await self._fail(answers, ref, err)
                    continue
                devices = tuple(
                    checkpointing.PreparedDevice(
                        request_names=a.request_names,
                        pool_name=a.pool_name,
                        device_name=a.device_name,
                        cdi_device_ids=(cdi_id,),
                        edits=a.edits,
                    )
                    for a, cdi_id in zip(allocations, ids, strict=True)
                )
                staged.append(
                    (
                        ref,
                        checkpointing.ClaimRecord(
                            namespace=ref.namespace,
                            name=ref.name,
                            state=checkpointing.COMPLETED,
                            devices=devices,
                        ),
                    )
                )
            if not staged:
                return answers
            failed, commit_error = self._complete(staged)
            prepared: list[claims.ClaimRef] = []
            for ref, record in staged:
                if ref.uid in failed:
                    await self._fail(answers, ref, failed[ref.uid], committed=True)
                elif commit_error is not None:
                    # Still "started", in memory and on disk: a retry redoes these claims.
                    answers[ref.uid] = PrepareResult(error=str(commit_error))
                else:
                    answers[ref.uid] = PrepareResult(devices=record.devices)
                    prepared.append(ref)
            _log_claims(prepared, "prepared")
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

    def _complete(
        self, staged: Sequence[tuple[claims.ClaimRef, checkpointing.ClaimRecord]]
    ) -> tuple[dict[str, Exception], errors.CheckpointError | None]:
        """Write each claim's spec, then record those written as completed.

        Runs under the owner's lock. Returns the claims whose spec failed
        (still "started", for the caller to undo) and the commit's error, if any.
        """
        failed: dict[str, Exception] = {}
        for ref, record in staged:
            try:
                if record.devices:
                    self._specs.write(ref.uid, [device.edits for device in record.devices])
            except Exception as err:
                failed[ref.uid] = err
        self._crash_point("cdi-written")
        completed = {ref.uid: record for ref, record in staged if ref.uid not in failed}
        self._crash_point("before-checkpoint-completed")
        try:
            if completed:
                self.checkpoint.commit(put=completed)
        except errors.CheckpointError as err:
            return failed, err
        return failed, None

    async def _fail(
        self,
        answers: dict[str, PrepareResult],
        ref: claims.ClaimRef,
        err: Exception,
        *,
        committed: bool = False,
    ) -> None:
        logger.warning("preparing claim %s/%s failed: %s", ref.namespace, ref.name, err)
        answers[ref.uid] = PrepareResult(error=str(err) or type(err).__name__)
        await self._undo(ref, committed=committed)

    def _answer_prepared(
        self, uid: claims.ClaimUID, record: checkpointing.ClaimRecord
    ) -> PrepareResult:
        # A reboot empties /var/run/cdi while the checkpoint survives, and a
        # spec is not fsynced (module docstring): rebuild what is not intact.
        edits = [device.edits for device in record.devices]
        if edits and not self._specs.is_current(uid, edits):
            self._specs.write(uid, edits)
        return PrepareResult(devices=record.devices)

    async def _undo(self, ref: claims.ClaimRef, *, committed: bool) -> None:
        """Take back a failed claim's prepare (and the owner's commit, if it was made).

        If that fails, the claim's release is pending instead of forgotten.
        """
        try:
            await self._policy.unprepare(ref.uid)
            self._specs.remove(ref.uid)
            if committed:
                await self._owner.claim_released(ref)
        except Exception as err:
            logger.error(
                "undoing claim %s/%s failed, its release is pending: %s",
                ref.namespace,
                ref.name,
                err,
            )
            self._keep_pending(ref)
            return
        self.checkpoint.claims.pop(ref.uid, None)

    def _keep_pending(self, ref: claims.ClaimRef) -> None:
        record = checkpointing.ClaimRecord(
            namespace=ref.namespace, name=ref.name, state=checkpointing.RELEASE_PENDING
        )
        try:
            self.checkpoint.commit(put={ref.uid: record})
        except errors.CheckpointError as err:
            # On disk it stays "started", which an unprepare after a restart
            # releases too; only the release before a new prepare is lost then.
            logger.error("recording claim %s's pending release failed: %s", ref.uid, err)
            self.checkpoint.claims[ref.uid] = record

    async def _release(self, ref: claims.ClaimRef) -> None:
        """What the policy and the owner hold for a claim, given back."""
        await self._policy.unprepare(ref.uid)
        await self._owner.claim_released(ref)

    async def _retry_release(self, ref: claims.ClaimRef) -> None:
        """Release a claim whose release is pending, before it is prepared afresh.

        Its record stays pending until the prepare's "started" replaces it.
        """
        try:
            await self._release(ref)
            self._specs.remove(ref.uid)
        except Exception as err:
            raise errors.ClaimError(
                f"claim {ref.namespace}/{ref.name} not prepared: what an earlier failed "
                f"prepare left could not be released: {err}"
            ) from err
        logger.info("claim %s/%s: its pending release is done", ref.namespace, ref.name)

    async def unprepare_resource_claims(
        self, refs: Sequence[claims.ClaimRef]
    ) -> dict[str, Exception | None]:
        """Release each claim on its own; an unknown claim succeeds."""
        results: dict[str, Exception | None] = {}
        async with self._owner.lock:
            released: list[claims.ClaimUID] = []
            held: list[claims.ClaimRef] = []
            for ref in refs:
                try:
                    claims.validate_ref(ref)
                    if ref.uid in self.checkpoint.claims:
                        await self._release(ref)
                        held.append(ref)
                    # An unknown claim succeeds; a spec left by a crash still goes.
                    released.append(ref.uid)
                    results[ref.uid] = None
                except Exception as err:
                    results[ref.uid] = err
            failed = self._commit_release(released, held=[ref.uid for ref in held])
            results.update(failed)
            _log_claims([ref for ref in held if ref.uid not in failed], "released")
        return results

    def _commit_release(
        self, released: Sequence[claims.ClaimUID], *, held: Sequence[claims.ClaimUID]
    ) -> dict[str, Exception]:
        """Drop the held claims from the checkpoint, then remove the released specs.

        Specs go after the commit: a crash between leaves a spec without a
        claim, which the next start removes; the other order could leave a
        prepared claim without its spec and nothing to say so.
        """
        failed: dict[str, Exception] = {}
        try:
            if held:
                self.checkpoint.commit(drop=held)
        except errors.CheckpointError as err:
            return {uid: err for uid in released}
        for uid in released:
            try:
                self._specs.remove(uid)
            except (OSError, errors.PluginError) as err:
                failed[uid] = err
        return failed

    def prepared(self) -> Mapping[claims.ClaimUID, checkpointing.ClaimRecord]:
        return dict(self.checkpoint.claims)


def _log_claims(refs: Sequence[claims.ClaimRef], done: str) -> None:
    # One line per call, not per claim: a line costs as much as a claim's work.
    if refs:
        noun = "claim" if len(refs) == 1 else "claims"
        logger.info("%s %s %s", noun, " ".join(f"{r.namespace}/{r.name}" for r in refs), done)


def current_boot_id() -> str:
    """This boot of the node (host-wide, also inside a container); "" if unknown."""
    try:
        return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _not_allowed() -> str:
    return str(errors.NotAllowedError("claims are not served yet: the owner is synchronizing"))
