"""The emulator's device health, against the 1.37 kubelet's healthinfo.go and
manager.go rules (cache, state file, streams, allocatedResourcesStatus)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kmm.kubelet import checkpoint, health


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def report(device: str, state: str, timeout: float = health.DEFAULT_TIMEOUT) -> health.DeviceHealth:
    return health.DeviceHealth("pool", device, state, last_updated=0.0, timeout=timeout)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_report_holds_for_its_timeout_then_reads_unknown(tmp_path: Path, clock: Clock) -> None:
    cache = health.Cache(tmp_path / health.FILE_NAME, clock)
    assert cache.get("d", "pool", "dev0") == health.UNKNOWN  # never reported
    changed = cache.update("d", [report("dev0", health.HEALTHY, timeout=10)])
    assert [c.device_name for c in changed] == ["dev0"]
    clock.now += 10
    assert cache.get("d", "pool", "dev0") == health.HEALTHY
    clock.now += 0.5
    assert cache.get("d", "pool", "dev0") == health.UNKNOWN


def test_the_kubelets_clock_stamps_reports_not_the_plugins(tmp_path: Path, clock: Clock) -> None:
    cache = health.Cache(None, clock)
    stale = health.DeviceHealth("pool", "dev0", health.HEALTHY, last_updated=5.0, timeout=30)
    cache.update("d", [stale])
    assert cache.get("d", "pool", "dev0") == health.HEALTHY
    assert cache.drivers["d"]["pool/dev0"].last_updated == clock.now


def test_only_changes_are_reported_and_a_silent_device_times_out(clock: Clock) -> None:
    cache = health.Cache(None, clock)
    cache.update("d", [report("a", health.HEALTHY), report("b", health.HEALTHY, timeout=5)])
    assert cache.update("d", [report("a", health.HEALTHY), report("b", health.HEALTHY, 5)]) == []
    clock.now += 6
    # b is left out of this message and its report has timed out: Unknown, a change.
    changed = cache.update("d", [report("a", health.UNHEALTHY)])
    assert {(c.device_name, c.health) for c in changed} == {
        ("a", health.UNHEALTHY),
        ("b", health.UNKNOWN),
    }
    # 1.37 drops it (absent reads Unknown), and says nothing when it goes quiet again.
    assert set(cache.drivers["d"]) == {"pool/a"}
    assert cache.get("d", "pool", "b") == health.UNKNOWN


def test_a_driver_whose_stream_ended_is_forgotten(tmp_path: Path, clock: Clock) -> None:
    cache = health.Cache(tmp_path / health.FILE_NAME, clock)
    cache.update("d", [report("a", health.HEALTHY)])
    cache.clear("d")
    assert cache.get("d", "pool", "a") == health.UNKNOWN
    assert json.loads((tmp_path / health.FILE_NAME).read_text()) == {}


def test_the_state_file_has_the_kubelets_shape_and_is_read_back(
    tmp_path: Path, clock: Clock
) -> None:
    clock.now = 1_700_000_000.25
    path = tmp_path / health.FILE_NAME
    health.Cache(path, clock).update("d", [report("a", health.UNHEALTHY, timeout=45)])
    # Go's JSON of DevicesHealthMap: a time.Time and a time.Duration in nanoseconds.
    assert json.loads(path.read_text()) == {
        "d": {
            "Devices": {
                "pool/a": {
                    "PoolName": "pool",
                    "DeviceName": "a",
                    "Health": "Unhealthy",
                    "LastUpdated": "2023-11-14T22:13:20.25Z",
                    "HealthCheckTimeout": 45_000_000_000,
                    "Message": "",
                }
            }
        }
    }
    again = health.Cache(path, clock)
    assert again.get("d", "pool", "a") == health.UNHEALTHY
    assert again.drivers["d"]["pool/a"].last_updated == pytest.approx(clock.now)


def test_a_kubelet_written_file_with_nanoseconds_and_an_offset_is_read(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / health.FILE_NAME
    path.write_text(
        '{"d":{"Devices":{"p/x":{"PoolName":"p","DeviceName":"x","Health":"Healthy",'
        '"LastUpdated":"2023-11-15T00:13:20.123456789+02:00","HealthCheckTimeout":0}}}}'
    )
    cache = health.Cache(path, clock)
    assert cache.drivers["d"]["p/x"].last_updated == pytest.approx(1_700_000_000.123456789)
    assert cache.get("d", "p", "x") == health.HEALTHY  # 0: the default timeout


def test_an_unreadable_state_file_is_reported_and_left_alone(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / health.FILE_NAME
    path.write_text("{not json")
    cache = health.Cache(path, clock)
    assert "cannot be read" in caplog.text
    cache.update("d", [report("a", health.HEALTHY)])
    assert path.read_text() == "{not json"
    assert cache.get("d", "pool", "a") == health.HEALTHY


def test_next_expiry_is_the_earliest_valid_report(clock: Clock) -> None:
    cache = health.Cache(None, clock)
    assert cache.next_expiry() is None
    cache.update("d", [report("a", health.HEALTHY, 10), report("b", health.HEALTHY, 20)])
    assert cache.next_expiry() == clock.now + 10
    clock.now += 15
    assert cache.next_expiry() == clock.now + 5


def _device(pool: str, name: str, cdi: tuple[str, ...]) -> checkpoint.Device:
    return checkpoint.Device(
        pool_name=pool, device_name=name, share_id=None, request_names=("r",), cdi_device_ids=cdi
    )


def test_resource_statuses_name_claims_and_requests_and_list_every_device() -> None:
    devices = {
        "d.example.com": [_device("p", "x", ("d.example.com/dev=x",)), _device("p", "y", ())],
    }
    container = {
        "name": "main",
        "resources": {"claims": [{"name": "gpu", "request": "r"}, {"name": "other"}]},
    }
    statuses = health.resource_statuses(
        container,
        lambda name: devices if name == "gpu" else None,
        lambda driver, pool, device: (health.HEALTHY if device == "x" else health.UNHEALTHY, ""),
    )
    assert statuses == [
        {
            "name": "claim:gpu/r",
            "resources": [
                {"resourceID": "d.example.com/dev=x", "health": "Healthy"},
                {"resourceID": "d.example.com/p/y", "health": "Unhealthy"},
            ],
        }
    ]


def test_a_message_is_kept_compared_and_forgotten_with_its_report(clock: Clock) -> None:
    cache = health.Cache(None, clock)
    first = dataclasses.replace(report("a", health.UNHEALTHY, 10), message="ECC errors")
    assert cache.update("d", [first]) == [dataclasses.replace(first, last_updated=clock.now)]
    assert cache.read("d", "pool", "a") == (health.UNHEALTHY, "ECC errors")
    assert cache.update("d", [first]) == []
    # The same health with another message is a change (1.37).
    worse = dataclasses.replace(first, message="ECC errors: 12")
    assert [c.message for c in cache.update("d", [worse])] == ["ECC errors: 12"]
    clock.now += 11
    assert cache.read("d", "pool", "a") == (health.UNKNOWN, "")


def test_a_long_message_is_cut_to_1024_bytes_as_the_kubelet_cuts_it() -> None:
    assert health.truncate_message("x" * 1024) == "x" * 1024
    cut = health.truncate_message("é" * 600)  # 1200 bytes
    assert cut.endswith("...")
    assert len(cut.encode()) <= health.MAX_MESSAGE_BYTES
    assert cut == "é" * 510 + "..."  # 1021 bytes: half a character dropped


def test_a_driver_cannot_make_the_cache_grow_without_bound(clock: Clock) -> None:
    cache = health.Cache(None, clock)
    many = [report(f"dev{i}", health.HEALTHY) for i in range(health.MAX_DEVICES_PER_DRIVER)]
    cache.update("d", many)
    changed = cache.update("d", [report("new", health.HEALTHY), report("dev0", health.UNHEALTHY)])
    assert [c.device_name for c in changed] == ["dev0"]  # known ones are still updated
    assert cache.get("d", "pool", "new") == health.UNKNOWN
    assert len(cache.drivers["d"]) == health.MAX_DEVICES_PER_DRIVER


def test_entries_follow_the_request_list_each_id_once_and_carry_messages() -> None:
    def device(name: str, requests: tuple[str, ...] | None, cdi: tuple[str, ...]) -> Any:
        return checkpoint.Device("p", name, None, requests, cdi)

    devices = {
        "d.example.com": [
            device("x", ("r",), ("d.example.com/dev=shared",)),
            device("y", ("r",), ("d.example.com/dev=shared",)),  # the same CDI id
            device("z", ("other",), ()),  # another request's
            device("w", None, ()),  # recorded without request names: serves all
        ]
    }
    container = {"name": "main", "resources": {"claims": [{"name": "gpu", "request": "r/sub"}]}}

    def reading(driver: str, pool: str, name: str) -> tuple[str, str]:
        return (health.UNHEALTHY, f"{name} is gone") if name == "x" else (health.HEALTHY, "")

    statuses = health.resource_statuses(container, lambda _: devices, reading)
    assert statuses == [
        {
            "name": "claim:gpu/r/sub",
            "resources": [
                {
                    "resourceID": "d.example.com/dev=shared",
                    "health": "Unhealthy",
                    "message": "x is gone",
                },
                {"resourceID": "d.example.com/p/w", "health": "Healthy"},
            ],
        }
    ]
    quiet = health.resource_statuses(container, lambda _: devices, reading, with_messages=False)
    assert "message" not in quiet[0]["resources"][0]
