"""What the two device-workload builders (device plugin, DRA driver) share."""

from __future__ import annotations

import copy
from typing import Any

import grpcservers
import operator_fixtures as fixtures
import pytest
from grpc import aio
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kmm.api import examples, validation
from kmm.kubelet import probes
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.dra import builders as dra_builders


def _device_plugin_pod(**plugin: Any) -> dict[str, Any]:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/plugin:1"}, **plugin})
    spec: dict[str, Any] = deviceplugin_builders.daemonset(fixtures.module(raw))["spec"][
        "template"
    ]["spec"]
    return spec


def _dra_pod(**dra: Any) -> dict[str, Any]:
    raw = examples.dra_module()
    raw["spec"]["dra"].update(dra)
    spec: dict[str, Any] = dra_builders.daemonset(validation.parse_module(raw))["spec"]["template"][
        "spec"
    ]
    return spec


@pytest.mark.parametrize("build", [_device_plugin_pod, _dra_pod], ids=["device-plugin", "dra"])
@pytest.mark.parametrize(("automount", "expected"), [(False, False), (True, True), (None, None)])
def test_automount_service_account_token_reaches_the_pod(
    build: Any, automount: bool | None, expected: bool | None
) -> None:
    """KMM's field, carried as is; unset, the pod spec leaves it to the service account."""
    fields = {} if automount is None else {"automountServiceAccountToken": automount}
    spec = build(**fields)
    assert spec.get("automountServiceAccountToken") == expected
    assert ("automountServiceAccountToken" in spec) is (expected is not None)


_PRESET_DRIVER = {"name": "DRIVER_NAME", "value": "gpu.example.com"}


def test_a_preset_variable_the_user_sets_too_is_set_once_with_the_users_value() -> None:
    """Upstream KMM's CI Module sets DRIVER_NAME, which kmm presets: a
    server-side apply refuses an env list with a name twice (500,
    "duplicate entries for key"), so the DaemonSet was never made."""
    spec = _dra_pod(
        container={
            "image": "r.io/driver:1",
            "env": [{"name": "LOG", "value": "debug"}, {"name": "DRIVER_NAME", "value": "mine"}],
        }
    )
    env = spec["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("DRIVER_NAME") == 1
    assert {"name": "DRIVER_NAME", "value": "mine"} in env
    # The presets first, then the user's list in its own order.
    assert names[-2:] == ["LOG", "DRIVER_NAME"]
    assert names[:2] == ["NODE_NAME", "POD_UID"]


@pytest.mark.parametrize("build", [_device_plugin_pod, _dra_pod], ids=["device-plugin", "dra"])
def test_a_name_repeated_in_the_users_env_is_set_once_the_last_value_winning(build: Any) -> None:
    """The kubelet takes the last of a repeated name; server-side apply
    refuses the list, so every container kmm builds keeps the last one."""
    repeated = {
        "image": "r.io/x:1",
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "2"},
            {"name": "A", "value": "3"},
        ],
    }
    spec = build(container=repeated, initContainer=repeated)
    for container in (*spec["containers"], *spec["initContainers"]):
        mine = [e for e in container["env"] if e["name"] in ("A", "B")]
        assert mine == [{"name": "B", "value": "2"}, {"name": "A", "value": "3"}]


async def _no_exec(argv: list[str], timeout: float) -> bool:
    raise AssertionError("no exec probe here")


def test_the_drivers_probes_wait_longer_than_the_kubelets_default_second() -> None:
    """On a VM node under TCG the driver's health check answered in more than
    a second ("failed to connect service ... within 1s"): three liveness
    timeouts in a row would restart a driver that serves claims."""
    container = _dra_pod()["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["timeoutSeconds"] == dra_builders.PROBE_TIMEOUT_SECONDS > 1


@pytest.mark.parametrize("services", [(), ("liveness",)], ids=["default", "liveness-only"])
async def test_a_driver_whose_health_server_knows_only_liveness_is_ready(
    services: tuple[str, ...],
) -> None:
    """Drivers written for upstream KMM's DaemonSet serve gRPC health for
    ``liveness`` only; gRPC's health servers answer the empty service (the
    server as a whole) SERVING from their start, so the DRA DaemonSet's
    readiness probe does not hold them unready (a probe of its own service
    name would: NOT_FOUND)."""
    health = health_aio.HealthServicer()
    for service in services:
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        container = _dra_pod()["containers"][0]
        readiness = copy.deepcopy(container["readinessProbe"])
        readiness["grpc"]["port"] = port
        assert await probes.check(readiness, container, _no_exec)
        own = {"grpc": {"port": port, "service": "readiness"}}
        assert not await probes.check(own, container, _no_exec)
    finally:
        await grpcservers.stop(server)
