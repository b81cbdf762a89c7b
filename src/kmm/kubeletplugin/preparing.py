"""Claims prepared and unprepared: the work behind the kubelet's calls.

A ``Preparer`` does it for one driver, under ``owner.lock`` (the plugin,
:mod:`kmm.kubeletplugin.plugins`, fetches the claims before and gates the
calls until the owner has synchronized). It changes the policy's devices,
the owner's commits, the checkpoint (``checkpointing``) and the CDI specs
(``cdi``), and keeps them agreeing.

Prepare, per call: validate each claim reference (a bad UID or name fails
that claim alone); answer claims already prepared from the checkpoint
(rewriting a CDI spec a reboot or a crash lost or tore); record the rest as
started (one checkpoint write), let the policy prepare each, write their
CDI specs, commit each through ``owner.claim_allocated``, and record them
completed (a second write). A failing claim is undone and answered with its
error; the others are unaffected. Unprepare releases each claim, commits
the checkpoint once, then removes the specs.

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
  starts; ``Plugin.start`` does this) and none is handed to the policy's
  ``restore``. So neither a lost "started" or "completed" line nor an
  undone unprepare can make a claim answer stale devices or hold them;
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

import dataclasses
import logging
from collections.abc import Callable, Sequence

from kmm.kubeletplugin import cdi, checkpointing, claims, errors, owners

__all__ = ["PrepareResult", "Preparer"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: its devices, or an error."""

    devices: tuple[checkpointing.PreparedDevice, ...] = ()
    error: str = ""


class Preparer:
    """Prepares and unprepares one driver's claims on one node."""

    def __init__(
        self,
        driver: claims.DriverName,
        *,
        owner: owners.Owner,
        policy: owners.Policy,
        checkpoint: checkpointing.Checkpoint,
        specs: cdi.SpecDir,
        crash_point: Callable[[str], None],
    ) -> None:
        self.driver = driver
        self.checkpoint = checkpoint
        self._owner = owner
        self._policy = policy
        self._specs = specs
        # Test seam: called at named points so a test can kill the process there.
        self._crash_point = crash_point

    async def prepare(
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

    async def unprepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, Exception | None]:
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


def _log_claims(refs: Sequence[claims.ClaimRef], done: str) -> None:
    # One line per call, not per claim: a line costs as much as a claim's work.
    if refs:
        noun = "claim" if len(refs) == 1 else "claims"
        logger.info("%s %s %s", noun, " ".join(f"{r.namespace}/{r.name}" for r in refs), done)
