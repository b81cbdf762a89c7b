"""Device health as the 1.37 kubelet keeps it (feature gate ``ResourceHealthStatus``, on by default since 1.36).

``Cache`` is the kubelet's ``healthInfoCache`` (``pkg/kubelet/cm/dra/healthinfo.go``):
per driver, per ``<pool>/<device>``, the last reported health and message,
when it was received (the kubelet stamps its own clock and ignores the
plugin's ``last_updated_time``) and for how long it holds (the report's
``health_check_timeout_seconds``, 30 s when zero or negative). A device whose
report is older than its timeout reads ``Unknown`` with no message; so does a
device never reported, and every device of a driver whose stream ended (the
cache forgets the driver). A device left out of a report whose own report has
timed out is dropped from the cache (1.37; 1.35 kept it as ``Unknown``), with
a change heard if it was not ``Unknown`` already; a driver's reports about
more than ``MAX_DEVICES_PER_DRIVER`` devices are ignored for the new ones.
It is kept in ``<root>/var/lib/kubelet/dra_health_state`` in the kubelet's
format (Go's JSON of ``DevicesHealthMap``, ``Message`` last), written
whenever an update changed or dropped something. A file that cannot be read
is reported and left alone, and this run keeps its health in memory only.

``Streams`` keeps one ``NodeWatchResources`` stream open per registered
plugin that lists a health service (``registration.choose_health_service``:
``v1`` preferred to ``v1alpha1``), on the plugin's own channel, and opens it
again 5 s after it ended (the kubelet's ``wait.Until`` period); a plugin that
answers ``UNIMPLEMENTED`` is not asked again until it registers anew, and one
that deregisters has its stream cancelled. Each report updates the cache
(messages cut to 1024 bytes, ``...`` ending a longer one), and the callback
hears which devices changed, so the pods holding them get a fresh status.

``resource_statuses`` is ``UpdateAllocatedResourcesStatus``: a container's
``allocatedResourcesStatus`` entries, one per claim (``claim:<name>``) or
request (``claim:<name>/<request>``) it names, each listing the health of the
claim's devices for that request (a device recorded without request names
serves every request) by their first CDI id (or ``driver/pool/device``), each
id once, with the device's message (``ResourceHealthStatusMessage``, beta and
on in 1.37).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import grpc

from kmm.kubelet import podclaims, registration
from kmm.kubeletplugin.protos import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "FILE_NAME",
    "HEALTHY",
    "MAX_DEVICES_PER_DRIVER",
    "MAX_MESSAGE_BYTES",
    "RETRY_PERIOD",
    "UNHEALTHY",
    "UNKNOWN",
    "Cache",
    "DeviceHealth",
    "Streams",
    "resource_statuses",
]

_log = logging.getLogger(__name__)

FILE_NAME: Final = "dra_health_state"
DEFAULT_TIMEOUT: Final = 30.0  # the kubelet's DefaultHealthTimeout
RETRY_PERIOD: Final = 5.0  # between the end of a stream and the next attempt
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
UNKNOWN: Final = "Unknown"
# healthinfo.go's maxDevicesPerDriver: a bound on what a plugin can make us keep.
MAX_DEVICES_PER_DRIVER: Final = 16384
# v1.ResourceHealthMessageMaxLength, in bytes (Go's len of a string).
MAX_MESSAGE_BYTES: Final = 1024
# The enum's numbers are the same in v1 and v1alpha1.
_BY_WIRE: Final = {
    dra_health_v1_pb2.HealthStatus.HEALTHY: HEALTHY,
    dra_health_v1_pb2.HealthStatus.UNHEALTHY: UNHEALTHY,
}
# Per health service a plugin may list: the stubs and the request to send.
_SERVICES: Final[dict[str, tuple[Any, Any]]] = {
    "v1.DRAResourceHealth": (dra_health_v1_pb2_grpc, dra_health_v1_pb2),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2_grpc, dra_health_v1alpha1_pb2),
}
_NANOS: Final = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class DeviceHealth:
    pool_name: str
    device_name: str
    health: str
    last_updated: float  # Unix seconds, the emulator's clock
    timeout: float  # seconds; 0 means DEFAULT_TIMEOUT
    message: str = ""

    @property
    def key(self) -> str:
        return f"{self.pool_name}/{self.device_name}"

    def current(self, now: float) -> str:
        return UNKNOWN if self.expired(now) else self.health

    def expired(self, now: float) -> bool:
        return now - self.last_updated > self._timeout()

    def expires(self) -> float:
        return self.last_updated + self._timeout()

    def _timeout(self) -> float:
        return self.timeout or DEFAULT_TIMEOUT


def _go_time(seconds: float) -> str:
    """Go's JSON of a ``time.Time`` in UTC: RFC 3339 with trailing zeros of the
    nanoseconds cut. A float holds microseconds of a current time, not nanoseconds."""
    nanos = round(seconds * 1_000_000) * 1000
    whole = datetime.datetime.fromtimestamp(nanos // _NANOS, datetime.UTC)
    fraction = f"{nanos % _NANOS:09d}".rstrip("0")
    return whole.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


_GO_TIME = re.compile(r"^(.{19})(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def _parse_go_time(text: str) -> float:
    found = _GO_TIME.match(text)
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if found[3] == "Z" else found[3]
    whole = datetime.datetime.fromisoformat(found[1] + zone).timestamp()
    return whole + int((found[2] or "0").ljust(9, "0")) / _NANOS


def _encode(drivers: Mapping[str, Mapping[str, DeviceHealth]]) -> bytes:
    document = {
        driver: {
            "Devices": {
                key: {
                    "PoolName": d.pool_name,
                    "DeviceName": d.device_name,
                    "Health": d.health,
                    "LastUpdated": _go_time(d.last_updated),
                    "HealthCheckTimeout": round(d.timeout * _NANOS),
                    "Message": d.message,
                }
                for key, d in sorted(devices.items())
            }
        }
        for driver, devices in sorted(drivers.items())
    }
    return json.dumps(document, separators=(",", ":")).encode()


def _decode(data: bytes) -> dict[str, dict[str, DeviceHealth]]:
    document = json.loads(data)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    drivers: dict[str, dict[str, DeviceHealth]] = {}
    for driver, state in document.items():
        devices = drivers[driver] = {}
        for key, d in ((state or {}).get("Devices") or {}).items():
            devices[key] = DeviceHealth(
                pool_name=str(d.get("PoolName", "")),
                device_name=str(d.get("DeviceName", "")),
                health=str(d.get("Health", "")),
                last_updated=_parse_go_time(str(d.get("LastUpdated", "0001-01-01T00:00:00Z"))),
                timeout=int(d.get("HealthCheckTimeout") or 0) / _NANOS,
                message=str(d.get("Message") or ""),  # a 1.35 file has none
            )
    return drivers


class Cache:
    """Health of devices per driver; ``path`` None keeps it in memory only."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.drivers: dict[str, dict[str, DeviceHealth]] = {}
        if path is None:
            return
        try:
            self.drivers = _decode(path.read_bytes())
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError) as err:
            # The kubelet logs this and later writes over it; we keep the
            # file for whoever wants to look, and do not persist this run.
            _log.error("device health state %s cannot be read (%s); not writing it", path, err)
            self.path = None

    def get(self, driver: str, pool: str, device: str) -> str:
        return self.read(driver, pool, device)[0]

    def read(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """A device's health and message now (a timed-out report: Unknown, no message)."""
        found = self.drivers.get(driver, {}).get(f"{pool}/{device}")
        if found is None or found.expired(self.clock()):
            return UNKNOWN, ""
        return found.health, found.message

    def update(self, driver: str, reports: Iterable[DeviceHealth]) -> list[DeviceHealth]:
        """Take one stream message; the devices whose health, message or timeout
        changed. Devices the message left out keep their report until it times
        out; then they are dropped."""
        now = self.clock()
        devices = self.drivers.setdefault(driver, {})
        changed: list[DeviceHealth] = []
        reported: set[str] = set()
        ignored = 0
        for report in reports:
            report = dataclasses.replace(report, last_updated=now)
            before = devices.get(report.key)
            if before is None and len(devices) >= MAX_DEVICES_PER_DRIVER:
                ignored += 1
                continue
            reported.add(report.key)
            if before is None or _reading(before) != _reading(report):
                changed.append(report)
            devices[report.key] = report
        if ignored:
            _log.error(
                "health report of %s names more than %d devices; %d new ones ignored",
                driver,
                MAX_DEVICES_PER_DRIVER,
                ignored,
            )
        dropped = False
        for key, device in list(devices.items()):
            if key in reported or not device.expired(now):
                continue
            # Absent reads as Unknown: dropping it changes nothing for readers
            # unless it was not Unknown yet.
            if device.health != UNKNOWN:
                changed.append(
                    dataclasses.replace(device, health=UNKNOWN, message="", last_updated=now)
                )
            del devices[key]
            dropped = True
        if changed or dropped:
            self._save()
        return changed

    def clear(self, driver: str) -> None:
        """The driver's stream ended: nothing it said holds any more."""
        self.drivers.pop(driver, None)
        self._save()

    def next_expiry(self) -> float | None:
        """When the earliest still-valid report times out (Unix seconds)."""
        now = self.clock()
        pending = [
            d.expires()
            for devices in self.drivers.values()
            for d in devices.values()
            if d.health != UNKNOWN and d.expires() >= now
        ]
        return min(pending, default=None)

    def _save(self) -> None:
        if self.path is None:
            return
        staging = self.path.with_name(self.path.name + ".tmp")
        try:
            staging.write_bytes(_encode(self.drivers))
            staging.replace(self.path)
        except OSError as err:
            _log.error("saving device health to %s: %s", self.path, err)


def _reading(device: DeviceHealth) -> tuple[str, str, float]:
    return device.health, device.message, device.timeout


def truncate_message(message: str) -> str:
    """``truncateHealthMessage``: at most MAX_MESSAGE_BYTES bytes, a longer
    one cut to 1021 bytes and ``...`` appended. Go cuts bytes, possibly inside
    a character; what is cut of it is dropped here."""
    raw = message.encode()
    if len(raw) <= MAX_MESSAGE_BYTES:
        return message
    return raw[: MAX_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."


def _from_wire(device: Any) -> DeviceHealth:
    """One device of a v1 or v1alpha1 report (the same fields)."""
    timeout = float(device.health_check_timeout_seconds)
    return DeviceHealth(
        pool_name=device.device.pool_name,
        device_name=device.device.device_name,
        health=_BY_WIRE.get(device.health, UNKNOWN),
        last_updated=0.0,
        timeout=timeout if timeout > 0 else DEFAULT_TIMEOUT,
        message=truncate_message(device.message),
    )


Changed = Callable[[str, list[DeviceHealth]], None]  # driver, devices (empty: cleared)


class Streams:
    """One health stream per registered plugin, reopened when it ends."""

    def __init__(
        self,
        registry: registration.Registry,
        cache: Cache,
        changed: Changed,
        *,
        retry: float = RETRY_PERIOD,
    ) -> None:
        self.registry = registry
        self.cache = cache
        self.changed = changed
        self.retry = retry
        self._running: dict[int, asyncio.Task[None]] = {}  # by id(plugin)
        registry.add_listener(self._plugins_changed)

    def _plugins_changed(self, driver: str) -> None:
        current = {id(p): p for p in self.registry.plugins(driver) if p.health_service}
        for key, task in list(self._running.items()):
            if task.get_name() == f"health-{driver}" and key not in current:
                task.cancel()
                del self._running[key]
        for key, plugin in current.items():
            if key not in self._running:
                self._running[key] = asyncio.get_running_loop().create_task(
                    self._follow(plugin), name=f"health-{driver}"
                )

    async def _follow(self, plugin: registration.DRAPlugin) -> None:
        grpc_module, pb2 = _SERVICES[plugin.health_service]
        stub: Any = grpc_module.DRAResourceHealthStub(plugin.channel)
        while True:
            try:
                async for message in stub.NodeWatchResources(pb2.NodeWatchResourcesRequest()):
                    changed = self.cache.update(
                        plugin.driver, [_from_wire(d) for d in message.devices]
                    )
                    if changed:
                        self.changed(plugin.driver, changed)
                _log.info("health stream of %s ended", plugin.driver)
            except asyncio.CancelledError:
                self.cache.clear(plugin.driver)
                self.changed(plugin.driver, [])
                raise
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # Listed but not served: 1.37 stops watching; a driver
                    # that gains support registers anew.
                    _log.info("%s serves no health stream: not asked again", plugin.driver)
                    self.cache.clear(plugin.driver)
                    self.changed(plugin.driver, [])
                    return
                _log.info("health stream of %s: %s", plugin.driver, err)
            except Exception as err:  # any other failure: the stream ends, retried
                _log.info("health stream of %s: %s", plugin.driver, err)
            self.cache.clear(plugin.driver)
            self.changed(plugin.driver, [])
            await asyncio.sleep(self.retry)

    async def close(self) -> None:
        running = list(self._running.values())
        self._running.clear()
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task


Reading = Callable[[str, str, str], tuple[str, str]]  # driver, pool, device -> health, message


def resource_statuses(
    container: Mapping[str, Any],
    claim_of: Callable[[str], Mapping[str, list[Any]] | None],
    health_of: Reading,
    *,
    with_messages: bool = True,
) -> list[dict[str, Any]]:
    """``allocatedResourcesStatus`` of one container.

    ``claim_of(pod_claim_name)`` gives the prepared devices of the claim by
    driver (``checkpoint.Device``), or None when it is not known; entries
    without devices are left out, as the kubelet leaves them.
    ``with_messages`` is the ``ResourceHealthStatusMessage`` gate.
    """
    statuses: dict[str, dict[str, Any]] = {}
    for used in (container.get("resources") or {}).get("claims") or ():
        drivers = claim_of(str(used.get("name")))
        if drivers is None:
            continue
        name = f"claim:{used.get('name')}"
        request = str(used.get("request") or "")
        if request:
            name += f"/{request}"
        entries: list[dict[str, Any]] = []
        seen: set[str] = set()
        for driver, devices in drivers.items():
            for device in devices:
                names = device.request_names or ()
                if request and names and podclaims.base_request(request) not in names:
                    continue
                entry = _entry(driver, device, health_of, with_messages=with_messages)
                if entry["resourceID"] in seen:  # two devices may share a CDI id
                    continue
                seen.add(entry["resourceID"])
                entries.append(entry)
        if entries:
            statuses[name] = {"name": name, "resources": entries}
    return [statuses[name] for name in sorted(statuses)]


def _entry(driver: str, device: Any, health_of: Reading, *, with_messages: bool) -> dict[str, Any]:
    """``buildResourceHealth``: one device's entry."""
    ids = device.cdi_device_ids or ()
    health, message = health_of(driver, device.pool_name, device.device_name)
    entry: dict[str, Any] = {
        "resourceID": ids[0] if ids else f"{driver}/{device.pool_name}/{device.device_name}",
        "health": health,
    }
    if with_messages and message:
        entry["message"] = message
    return entry
