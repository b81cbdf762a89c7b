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

Claims: every call is refused until ``allow_claims``; NodePrepareResources
fetches its claims (from the claim source, within ``LOOKUP_BUDGET``) before
taking the lock. The work on them, and what it writes and fsyncs, is
:mod:`kmm.kubeletplugin.preparing`'s. At start, after a reboot, every claim
the checkpoint holds from an earlier boot is given back to the kubelet's
next prepare as "started" (the kubelet prepares every claim again after a
reboot, before any container starts), and none is handed to the policy's
``restore``.
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
    preparing,
    publishing,
    serving,
)

__all__ = ["Paths", "Plugin", "current_boot_id", "driver_name"]

logger = logging.getLogger(__name__)

V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
# Health services, newest first: a 1.37 kubelet picks the newest it knows
# among those advertised (v1alpha1 it keeps until 1.40); 1.35 and 1.36
# kubelets ignore the v1 entry and call v1alpha1 whether advertised or not.
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
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
        self._specs = cdi.SpecDir(paths.cdi_dir, vendor=driver)
        self.checkpoint = checkpointing.Checkpoint(paths.plugin_data_dir)
        self._preparer = preparing.Preparer(
            self.driver,
            owner=owner,
            policy=policy,
            checkpoint=self.checkpoint,
            specs=self._specs,
            # Test seam: called at named points so a test can kill the process there.
            crash_point=crash_point or (lambda _point: None),
        )
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
        versions = [V1, V1BETA1, *(HEALTH_VERSIONS if self._serve_health else ())]
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

    async def node_prepare(
        self, refs: Sequence[claims.ClaimRef]
    ) -> dict[str, preparing.PrepareResult]:
        """The kubelet's NodePrepareResources: fetch claims, then prepare them."""
        answers: dict[str, preparing.PrepareResult] = {}
        unique = list({ref.uid: ref for ref in refs}.values())
        if not self._allowed:
            return {ref.uid: preparing.PrepareResult(error=_not_allowed()) for ref in unique}
        valid: list[claims.ClaimRef] = []
        for ref in unique:
            try:
                claims.validate_ref(ref)
            except errors.ClaimError as err:
                answers[ref.uid] = preparing.PrepareResult(error=str(err))
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
                answers[ref.uid] = preparing.PrepareResult(error=f"cannot get claim: {err}")
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
    ) -> dict[str, preparing.PrepareResult]:
        """Prepare each claim on its own under the owner's lock (``preparing``)."""
        return await self._preparer.prepare(resource_claims)

    async def unprepare_resource_claims(
        self, refs: Sequence[claims.ClaimRef]
    ) -> dict[str, Exception | None]:
        """Release each claim on its own; an unknown claim succeeds (``preparing``)."""
        return await self._preparer.unprepare(refs)

    def prepared(self) -> Mapping[claims.ClaimUID, checkpointing.ClaimRecord]:
        return dict(self.checkpoint.claims)


def current_boot_id() -> str:
    """This boot of the node (host-wide, also inside a container); "" if unknown."""
    try:
        return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _not_allowed() -> str:
    return str(errors.NotAllowedError("claims are not served yet: the owner is synchronizing"))
