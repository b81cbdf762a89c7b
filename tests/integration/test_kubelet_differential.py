"""The emulator beside the real kubelet: the same scenarios on a kubelet node and
on an emulated node of one sandbox, ``kmm driver`` on both, compared.

What is compared: the claims the driver was asked to prepare and release (its
log), the pod phases, the Event reasons and messages (up to the gRPC error's
own words), and the two ``dra_manager_state`` files with names and uids
replaced by their roles (the order of entries aside); across a failing
prepare and a kubelet restart, how often the driver is asked to prepare.
Differences that remain are listed in the issue's note.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import test_kubelet_emulator as emulated_nodes
import test_kubelet_nodes as real

from kmm.cli import paths
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubelet import checkpoint, emulator, nodes
from kmm.sandbox import cluster, restarting, testing
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes

NAMESPACE = real.NAMESPACE


@pytest.fixture(scope="module")
def both() -> Iterator[cluster.state.SandboxState]:
    directory = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))  # short: sockets live under it
    record = asyncio.run(
        cluster.up(
            cluster.Options(
                directory=directory, cache_dir=paths.cache_dir(), nodes=0, kubelet_nodes=1
            )
        )
    )
    try:
        yield record
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def emulated_node(
    api: kube_client.Client,
) -> AsyncIterator[tuple[emulated_nodes.EmulatedNode, emulator.Emulator]]:
    directory = Path(tempfile.mkdtemp(prefix="ke", dir="/tmp"))
    node = emulated_nodes.EmulatedNode("kmm-emulated-0", directory)
    node.root.mkdir()
    running = emulator.Emulator(
        api, emulator.Options(node=nodes.NodeSpec(name=node.name), root=node.root)
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(running.run(stop))
    try:
        yield node, running
    finally:
        stop.set()
        await task
        await api.request("DELETE", resources.NODES.path(name=node.name))
        shutil.rmtree(directory, ignore_errors=True)


def _roles(
    node: Any, module: str, pod_uids: dict[str, str], claim_names: dict[str, str]
) -> list[Any]:
    """The node's checkpoint with uids and generated names replaced by their roles."""
    blob = checkpoint.Store(node.kubelet_dir).path.read_bytes()
    found = json.loads(json.loads(blob)["Data"])["ClaimInfoStateList"]
    uids = {}
    for entry in found:
        uids[entry["ClaimUID"]] = f"claim:{claim_names.get(entry['ClaimName'], entry['ClaimName'])}"
        entry["ClaimName"] = claim_names.get(entry["ClaimName"], entry["ClaimName"])
        entry["PodUIDs"] = sorted(pod_uids.get(uid, uid) for uid in entry["PodUIDs"])
        for state in entry["DriverState"].values():
            # Two pods starting together may both prepare a shared claim, and
            # then its devices are listed twice; whether they do is timing,
            # for the kubelet and the emulator alike.
            unique = []
            for device in state["Devices"]:
                if device not in unique:
                    unique.append(device)
            state["Devices"] = unique
            for device in state["Devices"]:
                device["PoolName"] = "<node>"
                # Which device the scheduler picked is the scheduler's business.
                assert device["DeviceName"].startswith(module)
                device["DeviceName"] = "<device>"
                device["CDIDeviceIDs"] = [
                    i.replace(entry["ClaimUID"], "<claim uid>")
                    for i in device["CDIDeviceIDs"] or ()
                ]
        entry["ClaimUID"] = uids[entry["ClaimUID"]]
    driver_names = {d for e in found for d in e["DriverState"]}
    text = json.dumps(sorted(found, key=lambda e: e["ClaimName"]), sort_keys=True)
    for index, driver in enumerate(sorted(driver_names)):
        text = text.replace(driver, f"<driver {index}>")
    roles: list[Any] = json.loads(text)
    return roles


def _source(event: dict[str, Any]) -> str:
    """The component that reported a core/v1 Event."""
    return str(
        (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    )


async def _scenario(
    api: kube_client.Client, node: Any, driver: real.Driver
) -> tuple[list[Any], dict[str, str], list[str], list[tuple[str, str]]]:
    """Two pods: one with a template claim, two sharing a claim; the state while
    they run, the phases, and the Event reasons once they are deleted."""
    template = await real._template(api, driver)
    shared = await real._claim(api, driver)
    pods = {
        f"t-{driver.module}": [{"name": "dev", "resourceClaimTemplateName": template}],
        f"s1-{driver.module}": [{"name": "dev", "resourceClaimName": shared}],
        f"s2-{driver.module}": [{"name": "dev", "resourceClaimName": shared}],
    }
    for name, claims in pods.items():
        body = real._pod(name, claims)
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
        await real._create(api, resources.PODS.path(NAMESPACE), body)
    for name in pods:
        await testing.eventually(lambda n=name: real._running(api, n), f"{name} Running", bound=120)
    uids, claim_names = {}, {shared: "shared"}
    phases = {}
    for name in pods:
        state = await api.request("GET", resources.PODS.path(NAMESPACE, name))
        role = name.split("-", 1)[0]
        uids[state["metadata"]["uid"]] = f"pod:{role}"
        phases[role] = state["status"]["phase"]
        for status in state["status"].get("resourceClaimStatuses") or ():
            claim_names[status["resourceClaimName"]] = "from-template"
    roles = _roles(node, driver.module, uids, claim_names)
    for name in pods:
        await real._delete_pod(api, name)
    await testing.eventually(lambda: emulated_nodes._unprepared(node, driver), "all unprepared")
    listing = await api.request(
        "GET", resources.EVENTS.path(NAMESPACE), query={"fieldSelector": "type=Warning"}
    )
    # The kubelets' own Warnings only: the scheduler's (FailedScheduling while
    # its cache has not yet seen the driver's ResourceSlice) are another
    # component's timing, the same for both nodes. FailedMount is the real
    # kubelet's volume manager, not DRA: right after its start the
    # kube-root-ca.crt ConfigMap of the token volume may not be in its cache
    # yet (a transient Warning); the emulator mounts nothing.
    reasons = sorted(
        {
            e["reason"]
            for e in listing["items"]
            if e["involvedObject"]["name"] in pods
            and _source(e) == "kubelet"
            and e["reason"] != "FailedMount"
        }
    )
    await api.request("DELETE", resources.RESOURCE_CLAIMS.path(NAMESPACE, shared))
    # What the driver was asked, per claim (how often is timing: see _roles).
    asked = sorted(
        {
            (claim_names.get(words[-2].split("/")[-1], words[-2]), words[-1])
            for line in driver.log.read_text().splitlines()
            if (words := line.split())[-1:] in (["prepared"], ["released"])
        }
    )
    return roles, phases, reasons, asked


class Scenario(Protocol):
    """One story, run against a node with ``kmm driver`` on it; what it saw."""

    async def __call__(self, api: kube_client.Client, node: Any, driver: real.Driver) -> Any: ...


async def _on_both(both: cluster.state.SandboxState, scenario: Scenario) -> list[Any]:
    """``scenario`` on the real kubelet's node, then on an emulated node."""
    async with cluster.api_client(both.kubeconfig) as api:
        kubelet_node = cluster.kubelet_node(both.directory, f"{kubeletnodes.NODE_PREFIX}0")
        async with emulated_node(api) as (emulated_one, _):
            results = []
            for node in (kubelet_node, emulated_one):
                async with real.running_driver(both, node, api) as driver:
                    results.append(await scenario(api, node, driver))
    return results


async def test_the_emulator_and_the_real_kubelet_agree(
    both: cluster.state.SandboxState,
) -> None:
    results = await _on_both(both, _scenario)
    (real_roles, real_phases, real_reasons, real_asked), emulated = results[0], results[1]
    assert emulated[0] == real_roles
    assert emulated[1] == real_phases
    assert emulated[2] == real_reasons
    assert emulated[3] == real_asked
    assert real_asked == [
        ("from-template", "prepared"),
        ("from-template", "released"),
        ("shared", "prepared"),
        ("shared", "released"),
    ]


def _prepares(driver: real.Driver) -> int:
    """How many NodePrepareResources calls the driver was asked (its debug log)."""
    return driver.said("kmm.kubeletplugin.serving: NodePrepareResources: ")


class Restarting(Protocol):
    """A node's kubelet restarted, and what it did after: ``synced`` once a
    pod sync has run on the restarted state (any prepare it would make is
    made by then); ``prepare_attempts`` since the restart, failed ones too."""

    async def restart(self) -> None: ...

    async def synced(self) -> bool: ...

    async def prepare_attempts(self) -> float: ...


@dataclasses.dataclass
class RealKubelet:
    """The kubelet process, restarted; its own ``/metrics`` start at 0 again."""

    sandbox: cluster.state.SandboxState
    node: kubeletnodes.KubeletNode

    async def restart(self) -> None:
        await restarting.restart(self.sandbox.directory, f"kubelet/{self.node.name}")

    async def synced(self) -> bool:
        return await real.kubelet_synced_a_pod(self.node, self.sandbox.directory / "pki")

    async def prepare_attempts(self) -> float:
        found = await real.kubelet_count(
            self.node,
            self.sandbox.directory / "pki",
            "dra_operations_duration_seconds_count",
            operation_name="PrepareResources",
        )
        assert found is not None
        return found


@dataclasses.dataclass
class EmulatedKubelet:
    """The emulator, restarted in place; its counters read from the restart on."""

    running: emulator.Emulator
    syncs: float = 0.0
    attempts: float = 0.0

    async def restart(self) -> None:
        self.attempts = emulated_nodes.pod_operations(self.running, "PrepareResources")
        await self.running.restart()
        # Passes of the pod loop wait for the restart: the next one sees it.
        self.syncs = emulated_nodes.pod_syncs(self.running)

    async def synced(self) -> bool:
        return emulated_nodes.pod_syncs(self.running) > self.syncs

    async def prepare_attempts(self) -> float:
        return emulated_nodes.pod_operations(self.running, "PrepareResources") - self.attempts


async def _failure_and_restart(
    api: kube_client.Client, node: Any, driver: real.Driver, kubelet: Restarting
) -> dict[str, Any]:
    """A pod whose driver is away, then back; a kubelet restart under a running
    pod; a second pod on the same claim after it."""
    seen: dict[str, Any] = {}
    claim = await real._claim(api, driver)
    first, second = f"a-{driver.module}", f"b-{driver.module}"
    await driver.kill()  # its socket left behind: the prepare call fails
    body = real._pod(first, [{"name": "dev", "resourceClaimName": claim}])
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    await real._create(api, resources.PODS.path(NAMESPACE), body)

    async def warned() -> list[dict[str, Any]]:
        listing = await api.request(
            "GET",
            resources.EVENTS.path(NAMESPACE),
            query={"fieldSelector": f"involvedObject.name={first},type=Warning"},
        )
        found: list[dict[str, Any]] = listing["items"]
        return found

    async def any_warning() -> bool:
        return bool(await warned())

    await testing.eventually(any_warning, "a Warning while the driver is away", bound=120)
    event = (await warned())[0]
    # The message up to the gRPC library's own words, which differ by language.
    seen["event"] = (event["reason"], event["message"].split(": rpc error")[0].split(": <")[0])
    state = await api.request("GET", resources.PODS.path(NAMESPACE, first))
    seen["phase while away"] = state["status"]["phase"]
    await driver.start()
    await testing.eventually(lambda: real._running(api, first), "Running once back", bound=120)
    prepared = _prepares(driver)
    registered = driver.registrations()
    # The count that must not move after the restart counted the prepares before it.
    assert await kubelet.prepare_attempts() > 0
    await kubelet.restart()
    await testing.eventually(real._registered(driver, registered), "registered again", bound=120)
    await testing.eventually(lambda: real._published(api, driver), "republished", bound=120)
    await testing.eventually(kubelet.synced, "a pod sync after the restart", bound=120)
    seen["prepare attempts after the restart"] = await kubelet.prepare_attempts()
    seen["prepares after the restart"] = _prepares(driver) - prepared
    after = await api.request("GET", resources.PODS.path(NAMESPACE, first))
    seen["restarts"] = [s["restartCount"] for s in after["status"]["containerStatuses"]]
    body = real._pod(second, [{"name": "dev", "resourceClaimName": claim}])
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    await real._create(api, resources.PODS.path(NAMESPACE), body)
    await testing.eventually(
        lambda: real._running(api, second), "the second pod Running", bound=120
    )
    seen["prepares for a new pod of the claim"] = _prepares(driver) - prepared
    for name in (first, second):
        await real._delete_pod(api, name)
    await testing.eventually(lambda: emulated_nodes._unprepared(node, driver), "all unprepared")
    await api.request("DELETE", resources.RESOURCE_CLAIMS.path(NAMESPACE, claim))
    return seen


async def test_a_failing_prepare_and_a_kubelet_restart_look_the_same_on_both(
    both: cluster.state.SandboxState,
) -> None:
    async with cluster.api_client(both.kubeconfig) as api:
        kubelet_node = cluster.kubelet_node(both.directory, f"{kubeletnodes.NODE_PREFIX}0")
        async with emulated_node(api) as (emulated_one, running):
            results = []
            kubelets: tuple[tuple[Any, Restarting], ...] = (
                (kubelet_node, RealKubelet(both, kubelet_node)),
                (emulated_one, EmulatedKubelet(running)),
            )
            for node, kubelet in kubelets:
                async with real.running_driver(both, node, api) as driver:
                    results.append(await _failure_and_restart(api, node, driver, kubelet))
        assert results[1] == results[0]
        assert results[0]["event"][0] == "FailedPrepareDynamicResources"
        assert results[0]["phase while away"] == "Pending"
        assert results[0]["restarts"] == [0]
        # 1.35 prepares only when it creates a pod's sandbox: not for a running
        # pod after a restart, but for a new pod of a claim it holds (marked
        # unprepared by the restart), which the driver must answer again.
        assert results[0]["prepare attempts after the restart"] == 0
        assert results[0]["prepares after the restart"] == 0
        assert results[0]["prepares for a new pod of the claim"] == 1


def _health(pod: dict[str, Any], names: dict[str, str]) -> list[Any]:
    """The pod's ``allocatedResourcesStatus`` with generated names (``names``:
    name -> role) replaced by their roles (1.37: health v1, its message
    carried; a resource's ID is its CDI device ID, of the claim's uid)."""

    def roles(text: str) -> str:
        for name, role in names.items():
            text = text.replace(name, role)
        return text

    found = []
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        for allocated in status.get("allocatedResourcesStatus") or ():
            found.append(
                {
                    "name": roles(allocated["name"]),
                    "resources": sorted(
                        (
                            roles(resource["resourceID"]),
                            resource.get("health", ""),
                            roles(resource.get("message", "")),
                        )
                        for resource in allocated.get("resources") or ()
                    ),
                }
            )
    return found


async def _health_rounds(api: kube_client.Client, node: Any, driver: real.Driver) -> list[Any]:
    """A pod with a template claim; its device's /dev node removed under the
    driver, then put back: what the kubelet writes into the pod's status at
    each turn, once the health it waits for is there."""
    template = await real._template(api, driver)
    name = f"h-{driver.module}"
    body = real._pod(name, [{"name": "dev", "resourceClaimTemplateName": template}])
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    await real._create(api, resources.PODS.path(NAMESPACE), body)
    await testing.eventually(lambda: real._running(api, name), f"{name} Running", bound=120)
    pod = await api.request("GET", resources.PODS.path(NAMESPACE, name))
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    allocated = await api.request("GET", resources.RESOURCE_CLAIMS.path(NAMESPACE, claim))
    device = allocated["status"]["allocation"]["devices"]["results"][0]["device"]
    names = {
        device: "<device>",
        allocated["metadata"]["uid"]: "<claim uid>",
        claim: "<claim>",
        driver.name: "<driver>",
        node.name: "<node>",
    }
    rounds: list[Any] = []

    async def reaches(health: str) -> None:
        async def there() -> bool:
            pod = await api.request("GET", resources.PODS.path(NAMESPACE, name))
            found = _health(pod, names)
            healths = {r[1] for entry in found for r in entry["resources"]}
            if healths == {health}:
                rounds.append(found)
                return True
            return False

        await testing.eventually(there, f"{name}'s device {health}", bound=120)

    await reaches("Healthy")
    (node.root / "dev" / device).unlink()
    await reaches("Unhealthy")
    (node.root / "dev" / device).write_text("")
    await reaches("Healthy")
    await real._delete_pod(api, name)
    await testing.eventually(lambda: emulated_nodes._unprepared(node, driver), "all unprepared")
    return rounds


async def test_device_health_reaches_the_pod_the_same_on_both(
    both: cluster.state.SandboxState,
) -> None:
    """What 1.37 added that the emulator meets: the health service (v1,
    chosen over v1alpha1) and the driver's message in the pod's
    ``allocatedResourcesStatus`` (ResourceHealthStatus), Healthy, Unhealthy
    while the device's node is gone, Healthy again."""
    results = await _on_both(both, _health_rounds)
    assert results[1] == results[0]
    healths = [{r[1] for entry in found for r in entry["resources"]} for found in results[0]]
    assert healths == [{"Healthy"}, {"Unhealthy"}, {"Healthy"}]
    # The driver's own words reach the pod (ResourceHealthStatusMessage).
    assert [r[2] for r in results[0][1][0]["resources"]] == ["/dev/<device> disappeared"]
