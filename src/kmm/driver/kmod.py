"""The kmod-devices policy: the devices a loaded kernel module exposes.

Discovery (under a configurable ``root`` so tests use a fake tree):

- with a device class: every entry of ``<root>/sys/class/<class>/`` whose
  ``/dev`` node exists (``--dev-pattern`` narrows them by name);
- without one: every ``<root>/dev/<pattern>`` node (default ``<module>*``).

``sys_dir`` / ``dev_dir`` say where the host's ``/sys`` and ``/dev`` are
mounted when the driver runs in a container; a CDI spec's ``hostPath`` still
names the node's ``/dev/...``, since the container runtime reads it on the
node (a device's mode comes from there).

Each device is published with its module name, kernel version, module
version (``/sys/module/<module>/version`` when present), major/minor (from
sysfs ``dev`` or the node's ``st_rdev``) and NUMA node (sysfs
``device/numa_node`` when not -1). A device is allocated to one claim at a
time; a prepared claim gets CDI ``deviceNodes`` for its devices, and for
each an environment variable naming its node (``KMM_DEVICE_FOO0=/dev/foo0``,
``env_name``), so a workload knows which of the module's devices it holds.

Health: a device that disappears is reported UNHEALTHY on the health stream,
which reports every device at each poll (the kubelet holds a report only for
its timeout). Given ``kernel_module``, every device is UNHEALTHY while that
module is not loaded (``kernelmodules.not_loaded``: ``/sys/module/<name>``
gone, or ``/proc/modules`` without it), whether or not its ``/dev`` node is
left behind, and HEALTHY again once it is back; without one, only the
``/dev`` nodes count.

The policy only reads files; it never loads modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import pathlib
import re
import stat
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from kmm.driver import kernelmodules
from kmm.kubeletplugin import cdi, checkpointing, claims, owners, publishing

__all__ = ["KmodDevice", "KmodPolicy", "env_name"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class KmodDevice:
    name: str  # DNS label, the published device name
    node: str  # path of the device node inside the container (/dev/...)
    host_path: pathlib.Path
    kind: str  # "c" or "b"
    major: int | None
    minor: int | None
    numa_node: int | None
    sysfs: pathlib.Path | None = None  # its /sys/class entry, when found through one


def _label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return label[:63].rstrip("-") or "dev"


def env_name(device: str) -> str:
    """The variable a prepared device's container gets, naming its node:
    ``KMM_DEVICE_<published name>`` in capitals, ``-`` as ``_``."""
    return "KMM_DEVICE_" + device.upper().replace("-", "_")


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class KmodPolicy:
    """Devices of one kernel module, one claim per device."""

    name = "kmod"
    # Publishing the module's devices is this policy's whole purpose, so with
    # dra.enabled unset it asks for DRA.
    wants_dra = True

    def __init__(
        self,
        *,
        root: pathlib.Path,
        module: str,
        node: str,
        device_class: str | None = None,
        dev_pattern: str | None = None,
        kernel_version: str | None = None,
        poll_interval: float = 10.0,
        sys_dir: pathlib.Path | None = None,
        dev_dir: pathlib.Path | None = None,
        proc_dir: pathlib.Path | None = None,
        kernel_module: str | None = None,
    ) -> None:
        self._root = root
        # Where the host's /sys and /dev are (a container mounts them elsewhere).
        self._sys = sys_dir or root / "sys"
        self._dev = dev_dir or root / "dev"
        # A container's own /proc shows the kernel's modules: no host mount needed.
        self._proc = proc_dir or root / "proc"
        self._kernel_module = kernel_module
        # The same /dev as the container runtime sees it, for the CDI spec's
        # hostPath: the runtime reads the node's device there (its mode, with
        # the numbers given), in its own mount namespace, where a dev_dir
        # mounted into the driver's container does not exist.
        self._node_dev = pathlib.Path("/dev") if dev_dir is not None else root / "dev"
        self._module = module
        self._node = node
        self._class = device_class
        self._pattern = dev_pattern or (None if device_class else f"{module}*")
        self._kernel = kernel_version or self._kernel_version()
        self._poll_interval = poll_interval
        self._known: dict[str, KmodDevice] = {}  # every device ever seen
        self._present: dict[str, KmodDevice] = {}  # at the last scan
        self._holders: dict[str, claims.ClaimUID] = {}
        self._by_claim: dict[claims.ClaimUID, list[str]] = {}
        self._poke = asyncio.Event()

    def update(
        self, *, device_class: str | None, dev_pattern: str | None, poll_interval: float
    ) -> None:
        """New discovery settings, used from the next scan on (which starts now)."""
        self._class = device_class
        self._pattern = dev_pattern or (None if device_class else f"{self._module}*")
        self._poll_interval = poll_interval
        self._present = {}  # found under the old settings
        self.poke()

    def _kernel_version(self) -> str:
        return _read(self._proc / "sys/kernel/osrelease") or os.uname().release

    # -- discovery -----------------------------------------------------------

    def discover(self) -> dict[str, KmodDevice]:
        """The devices present now, by published name."""
        self._present = self._scan()
        return self._present

    def _scan(self) -> dict[str, KmodDevice]:
        dev = self._dev
        found: dict[str, KmodDevice] = {}
        if self._class:
            class_dir = self._sys / "class" / self._class
            entries = sorted(class_dir.iterdir()) if class_dir.is_dir() else []
            for entry in entries:
                if self._pattern and not entry.match(self._pattern):
                    continue
                device = self._device(dev / entry.name, entry)
                if device is not None:
                    found[device.name] = device
        else:
            for path in sorted(dev.glob(self._pattern or "*")):
                device = self._device(path, None)
                if device is not None:
                    found[device.name] = device
        return found

    def _device(self, path: pathlib.Path, sysfs: pathlib.Path | None) -> KmodDevice | None:
        try:
            st = path.stat()
        except OSError:
            return None
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        major = minor = None
        numa = None
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        if sysfs is not None:
            numbers = _read(sysfs / "dev")
            if numbers and re.fullmatch(r"\d+:\d+", numbers):
                major, minor = (int(n) for n in numbers.split(":"))
            numa_text = _read(sysfs / "device/numa_node")
            if numa_text and re.fullmatch(r"\d+", numa_text):
                numa = int(numa_text)
        return KmodDevice(
            name=_label(path.name),
            node=f"/dev/{path.relative_to(self._dev)}",
            host_path=path,
            kind=kind,
            major=major,
            minor=minor,
            numa_node=numa,
            sysfs=sysfs,
        )

    def _present_now(self, names: Sequence[str]) -> dict[str, KmodDevice]:
        """Those of ``names`` present now.

        A prepare must not rescan every device for every claim: each device
        the last scan saw is checked with one stat of its node, and a full
        scan runs only for a name the last scan did not see or a node whose
        device numbers changed (the module was reloaded).
        """
        if any(not self._still_there(self._present.get(name)) for name in names):
            self.discover()
        return {name: self._present[name] for name in names if name in self._present}

    def _still_there(self, device: KmodDevice | None) -> bool:
        if device is None:
            return False
        try:
            st = os.stat(device.host_path)
        except OSError:
            return False
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            return (os.major(st.st_rdev), os.minor(st.st_rdev)) == (device.major, device.minor)
        return True

    def _attributes(self, device: KmodDevice) -> dict[str, publishing.DeviceAttribute]:
        attributes: dict[str, publishing.DeviceAttribute] = {
            "module": {"string": self._module},
            "kernelVersion": {"string": self._kernel},
        }
        version = _read(self._sys / "module" / self._module / "version")
        if version:
            attributes["moduleVersion"] = {"string": version}
        if device.major is not None and device.minor is not None:
            attributes["major"] = {"int": device.major}
            attributes["minor"] = {"int": device.minor}
        if device.numa_node is not None:
            attributes["numaNode"] = {"int": device.numa_node}
        return attributes

    # -- owners.Policy -------------------------------------------------------

    def devices(self) -> Sequence[publishing.Device]:
        present = self.discover()
        self._known.update(present)
        return [{"name": d.name, "attributes": self._attributes(d)} for d in present.values()]

    async def prepare(self, claim: owners.PreparingClaim) -> Sequence[owners.DeviceAllocation]:
        names = [result["device"] for result in claim.results]
        present = self._present_now(names)
        if len(set(names)) != len(names):
            raise ValueError("a claim cannot hold one device twice")
        for result in claim.results:
            if result["pool"] != self._node:
                raise ValueError(f"device {result['device']} is in pool {result['pool']}")
            if result["device"] not in present:
                raise ValueError(f"device {result['device']} is not present on this node")
            holder = self._holders.get(result["device"])
            if holder is not None and holder != claim.ref.uid:
                raise ValueError(f"device {result['device']} is held by claim {holder}")
        for name in names:
            self._holders[name] = claim.ref.uid
        self._by_claim[claim.ref.uid] = names
        return [
            owners.DeviceAllocation(
                request_names=(result["request"],),
                pool_name=result["pool"],
                device_name=result["device"],
                edits=self._edits(present[result["device"]]),
            )
            for result in claim.results
        ]

    def _edits(self, device: KmodDevice) -> cdi.ContainerEdits:
        node: cdi.DeviceNode = {
            "path": device.node,
            "hostPath": str(self._node_dev / device.host_path.relative_to(self._dev)),
            "type": device.kind,
            "permissions": "rw",
        }
        if device.major is not None and device.minor is not None:
            node["major"] = device.major
            node["minor"] = device.minor
        return {"env": [f"{env_name(device.name)}={device.node}"], "deviceNodes": [node]}

    async def unprepare(self, uid: claims.ClaimUID) -> None:
        for name in self._by_claim.pop(uid, []):
            if self._holders.get(name) == uid:
                del self._holders[name]

    def restore(
        self, prepared: Mapping[claims.ClaimUID, Sequence[checkpointing.PreparedDevice]]
    ) -> None:
        for uid, devices in prepared.items():
            names = [device.device_name for device in devices]
            self._by_claim[uid] = names
            for name in names:
                self._holders[name] = uid

    def holder(self, device: str) -> claims.ClaimUID | None:
        return self._holders.get(device)

    def health_supported(self) -> bool:
        return True

    def poke(self) -> None:
        """Rescan now instead of at the next poll."""
        self._poke.set()

    def health(self) -> list[owners.DeviceHealthReport]:
        """Every device seen so far: HEALTHY if present, UNHEALTHY if it
        disappeared or its kernel module is not loaded."""
        present = self.discover()
        self._known.update(present)
        unloaded = (
            kernelmodules.not_loaded(self._kernel_module, sys_dir=self._sys, proc_dir=self._proc)
            if self._kernel_module
            else None
        )
        now = int(time.time())
        reports: list[owners.DeviceHealthReport] = []
        for name in sorted(self._known):
            problem = self._problem(name, present, unloaded)
            reports.append(
                owners.DeviceHealthReport(
                    pool_name=self._node,
                    device_name=name,
                    health=owners.Health.HEALTHY if problem is None else owners.Health.UNHEALTHY,
                    message=problem or "",
                    last_updated=now,
                    timeout_seconds=self._health_timeout(),
                )
            )
        return reports

    def _problem(
        self, name: str, present: Mapping[str, KmodDevice], unloaded: str | None
    ) -> str | None:
        # The module's absence is the cause when both hold: unloading it
        # takes its /dev nodes with it.
        if unloaded is not None:
            return unloaded
        return None if name in present else f"{self._known[name].node} disappeared"

    def _health_timeout(self) -> int:
        # The kubelet trusts a report this long (its default is 30 s): three
        # polls, so one slow scan does not turn every device Unknown.
        return max(30, math.ceil(3 * self._poll_interval))

    async def watch_health(self) -> AsyncIterator[Sequence[owners.DeviceHealthReport]]:
        """Every device at once: on a change at once, and unchanged at every
        poll, because the kubelet holds a report only for its timeout."""
        last: list[tuple[str, owners.Health, str]] | None = None
        sent = -math.inf
        while True:
            # Cleared before the scan, so a poke during the yield is not lost.
            self._poke.clear()
            reports = self.health()
            # A new message (another cause) is news to the kubelet too.
            summary = [(r.device_name, r.health, r.message) for r in reports]
            now = time.monotonic()
            if summary != last or now - sent >= self._poll_interval:
                last, sent = summary, now
                yield reports
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), timeout=self._poll_interval)
