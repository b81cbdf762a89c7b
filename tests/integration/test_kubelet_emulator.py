"""``kmm kubelet`` on the sandbox, with ``kmm driver`` and with the Kubernetes
project's DRA test driver as the driver.

The real controller-manager makes the claims from templates, the real
scheduler allocates the driver's devices to pods bound for the emulated
node, and the emulator prepares and unprepares them through the driver's
DRA socket, keeping the kubelet's checkpoint. The tests that take
``new_driver`` run once per driver: what they check holds for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import k8s_test_driver
import pytest
import test_kubelet_nodes as real

from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.kubelet import checkpoint, emulator, nodes
from kmm.sandbox import testing

NAMESPACE = real.NAMESPACE

NewDriver = Callable[["EmulatedNode"], real.DriverProcess]
_METHODS = ("NodePrepareResources", "NodeUnprepareResources")


@pytest.fixture(scope="session")
def test_driver_binary() -> Path:
    return k8s_test_driver.binary()


@pytest.fixture(params=["kmm-driver", "k8s-test-driver"])
def new_driver(request: pytest.FixtureRequest, sandbox: testing.RunningSandbox) -> NewDriver:
    if request.param == "kmm-driver":
        return lambda node: real.Driver(sandbox, node)
    executable = request.getfixturevalue("test_driver_binary")
    return lambda node: k8s_test_driver.TestDriver(sandbox, node, executable)


@dataclasses.dataclass(frozen=True)
class EmulatedNode:
    """What the driver helpers need of a node: its name, root and a directory for logs."""

    name: str
    directory: Path

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var/lib/kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "var/run/cdi"


@contextlib.asynccontextmanager
async def emulated(
    kmm_api: kube_client.Client, *, node_spec: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[tuple[EmulatedNode, emulator.Emulator]]:
    directory = Path(tempfile.mkdtemp(prefix="ke", dir="/tmp"))  # short: sockets live here
    node = EmulatedNode(f"kmm-emulated-{uuid.uuid4().hex[:6]}", directory)
    node.root.mkdir()
    running = emulator.Emulator(
        kmm_api,
        emulator.Options(
            node=nodes.NodeSpec(name=node.name, **(node_spec or {})), root=node.root, **options
        ),
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(running.run(stop))

    async def registered() -> bool:
        try:
            await kmm_api.request("GET", resources.NODES.path(name=node.name))
        except kube_errors.NotFound:
            return False
        return True

    try:
        await testing.eventually(registered, "the emulated node registered")
        yield node, running
    finally:
        stop.set()
        await task
        with contextlib.suppress(kube_errors.NotFound):
            await kmm_api.request("DELETE", resources.NODES.path(name=node.name))
        shutil.rmtree(directory, ignore_errors=True)


def _on(node: EmulatedNode) -> dict[str, Any]:
    """Pod spec fields that bind a pod to the emulated node (through the scheduler)."""
    return {"nodeSelector": {"kubernetes.io/hostname": node.name}}


def _pod(name: str, node: EmulatedNode, claims: list[dict[str, str]]) -> dict[str, Any]:
    body = real._pod(name, claims)
    body["spec"].update(_on(node))
    return body


def _containers(node: EmulatedNode) -> dict[str, dict[str, list[str]]]:
    path = node.kubelet_dir / "kmm-emulator" / "containers.json"
    found: dict[str, dict[str, list[str]]] = json.loads(path.read_text()) if path.exists() else {}
    return found


def _claims(node: EmulatedNode) -> list[checkpoint.ClaimState]:
    return checkpoint.Store(node.kubelet_dir).load()


async def _unprepared(node: EmulatedNode, driver: real.Driver) -> bool:
    return not real._cdi_specs(node, driver) and not _claims(node)


def counted(running: emulator.Emulator, name: str, **labels: str) -> float:
    """The sum of the emulator's samples ``name`` carrying ``labels`` (its
    ``metrics``): how a test knows it had its turn."""
    return sum(
        sample.value
        for family in running.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def pod_operations(running: emulator.Emulator, operation: str) -> float:
    """``PrepareResources`` / ``UnprepareResources`` of a pod's claims, failed ones too."""
    return counted(running, "kmm_kubelet_dra_pod_operations_total", operation=operation)


def pod_syncs(running: emulator.Emulator) -> float:
    return counted(running, "kmm_kubelet_pod_syncs_total")


async def test_the_emulator_prepares_through_the_driver_and_unprepares_on_delete(
    new_driver: NewDriver, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api) as (node, running),
        real.running(new_driver(node), kmm_api) as driver,
    ):
        template = await real._template(kmm_api, driver)
        pod = f"e-{driver.module}"
        await real.start_pod(
            kmm_api, pod, [{"name": "dev", "resourceClaimTemplateName": template}], **_on(node)
        )
        (claim,) = _claims(node)
        (prepared,) = (claim.driver_state or {})[driver.name]
        state = await kmm_api.request("GET", resources.PODS.path(NAMESPACE, pod))
        assert claim.pod_uids == {state["metadata"]["uid"]}
        (spec_path,) = real._cdi_specs(node, driver)
        spec = json.loads(spec_path.read_text())
        assert [f"{spec['kind']}={d['name']}" for d in spec["devices"]] == list(
            prepared.cdi_device_ids or ()
        )
        if isinstance(driver, real.Driver):
            edits = [e["containerEdits"] for e in spec["devices"]]
            assert [d["path"] for e in edits for d in e["deviceNodes"]] == [
                f"/dev/{prepared.device_name}"
            ]
        assert _containers(node)[state["metadata"]["uid"]] == {
            "main": list(prepared.cdi_device_ids or ())
        }
        assert [running.manager.count(m) for m in _METHODS] == [1, 0]

        await real._delete_pod(kmm_api, pod)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared, checkpoint empty")
        assert [running.manager.count(m) for m in _METHODS] == [1, 1]
        assert checkpoint.Store(node.kubelet_dir).path.read_bytes() == checkpoint.encode([])


async def test_a_shared_claim_waits_for_both_pods_and_a_force_deletion_still_unprepares(
    new_driver: NewDriver, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api) as (node, running),
        real.running(new_driver(node), kmm_api) as driver,
    ):
        claim = await real._claim(kmm_api, driver)
        pods = [f"a-{driver.module}", f"b-{driver.module}"]
        for pod in pods:
            await real._create(
                kmm_api,
                resources.PODS.path(NAMESPACE),
                _pod(pod, node, [{"name": "dev", "resourceClaimName": claim}]),
            )
        for pod in pods:
            await testing.eventually(lambda p=pod: real._running(kmm_api, p), f"{pod} Running")
        (shared,) = _claims(node)
        assert len(shared.pod_uids or ()) == 2
        second = await real._pod_state(kmm_api, pods[1])
        assert second is not None
        unprepared = pod_operations(running, "UnprepareResources")
        # The pod goes at once (grace 0): the emulator's unprepare of it,
        # counted once done, proves it decided about the shared claim.
        await real._delete_pod(kmm_api, pods[0])

        async def first_unprepared() -> bool:
            return pod_operations(running, "UnprepareResources") > unprepared

        await testing.eventually(first_unprepared, "the first pod unprepared")
        (kept,) = _claims(node)
        assert kept.pod_uids == {second["metadata"]["uid"]}
        assert real._cdi_specs(node, driver)
        await real._delete_pod(kmm_api, pods[1], force=True)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared once both are gone")
        assert running.manager.count("NodeUnprepareResources") == 1
        await kmm_api.request("DELETE", resources.RESOURCE_CLAIMS.path(NAMESPACE, claim))


async def test_the_nodes_slices_are_wiped_at_start(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    name = f"kmm-emulated-{uuid.uuid4().hex[:6]}"
    await kmm_api.request(
        "POST", resources.NODES.path(), body=nodes.node_body(nodes.NodeSpec(name=name))
    )
    stale = await kmm_api.request(
        "POST",
        resources.RESOURCE_SLICES.path(),
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": "stale-"},
            "spec": {
                "driver": "stale.kmm.io",
                "nodeName": name,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "d0"}],
            },
        },
    )
    directory = Path(tempfile.mkdtemp(prefix="ke", dir="/tmp"))
    running = emulator.Emulator(
        kmm_api, emulator.Options(node=nodes.NodeSpec(name=name), root=directory / "root")
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(running.run(stop))
    try:

        async def wiped() -> bool:
            try:
                await kmm_api.request(
                    "GET", resources.RESOURCE_SLICES.path(name=stale["metadata"]["name"])
                )
            except kube_errors.NotFound:
                return True
            return False

        await testing.eventually(wiped, "the stale slice wiped at start")
    finally:
        stop.set()
        await task
        await kmm_api.request("DELETE", resources.NODES.path(name=name))
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_pod_whose_driver_is_away_stays_pending_with_the_event_then_runs(
    new_driver: NewDriver, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api, retry=0.5) as (node, _running),
        real.running(new_driver(node), kmm_api) as driver,
    ):
        template = await real._template(kmm_api, driver)
        # Killed, its socket left behind: registered but not connected, its
        # slice still published until the wipe delay; the prepare call fails.
        await driver.kill()

        async def disconnected() -> bool:
            return not _running.registry.usable(driver.name)

        await testing.eventually(disconnected, "the driver's connection lost")
        pod = f"w-{driver.module}"
        await real._create(
            kmm_api,
            resources.PODS.path(NAMESPACE),
            _pod(pod, node, [{"name": "dev", "resourceClaimTemplateName": template}]),
        )

        async def failed() -> bool:
            listing = await kmm_api.request(
                "GET",
                resources.EVENTS.path(NAMESPACE),
                query={"fieldSelector": f"involvedObject.name={pod}"},
            )
            return any(
                e["reason"] == "FailedPrepareDynamicResources"
                and e["message"].startswith("Failed to prepare dynamic resources: ")
                and "prepare dynamic resources: NodePrepareResources: " in e["message"]
                for e in listing["items"]
            )

        await testing.eventually(failed, "FailedPrepareDynamicResources while the driver is away")
        state = await kmm_api.request("GET", resources.PODS.path(NAMESPACE, pod))
        assert state["status"]["phase"] == "Pending"
        await driver.start()
        await testing.eventually(lambda: real._running(kmm_api, pod), "Running once it is back")
        await real._delete_pod(kmm_api, pod)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared")


async def test_a_driver_away_longer_than_the_delay_loses_its_slices_not_one_back_in_time(
    new_driver: NewDriver, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api, wipe_delay=3.0) as (node, running),
        real.running(new_driver(node), kmm_api) as driver,
    ):
        (first,) = await real._slices(kmm_api, driver)
        # Back within the delay: nothing wiped. The emulator counts how each
        # absence of a driver ended, returned or wiped: once this one ended,
        # its wipe had its chance.
        absences = "kmm_kubelet_driver_absences_total"
        ended = counted(running, absences, driver=driver.name)
        registered = driver.registrations()
        await driver.kill()

        async def away() -> bool:
            return not running.registry.usable(driver.name)

        await testing.eventually(away, "the driver's connection lost")
        await driver.start()
        await testing.eventually(real._registered(driver, registered), "registered again")

        async def absence_ended() -> bool:
            return counted(running, absences, driver=driver.name) > ended

        await testing.eventually(absence_ended, "the driver's absence ended")
        assert counted(running, absences, driver=driver.name, outcome="wiped") == 0
        assert [s["metadata"]["uid"] for s in await real._slices(kmm_api, driver)] == [
            first["metadata"]["uid"]
        ]
        # Away for longer: wiped; back: published again.
        await driver.kill()

        async def wiped() -> bool:
            return not await real._slices(kmm_api, driver)

        await testing.eventually(wiped, "wiped after the delay")
        await driver.start()
        await testing.eventually(lambda: real._published(kmm_api, driver), "republished")

        # The driver publishes as soon as it starts; the plugin watcher may
        # still be backing off from the socket that vanished with the kill.
        async def registered_again() -> bool:
            return running.registry.plugin(driver.name) is not None

        await testing.eventually(registered_again, "registered again")


async def test_kmm_kubelet_as_a_process_registers_its_node_and_stops_on_sigterm(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    name = f"kmm-emulated-{uuid.uuid4().hex[:6]}"
    directory = Path(tempfile.mkdtemp(prefix="ke", dir="/tmp"))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from kmm.cli import main; main()", "kubelet",
        f"--node={name}", f"--root={directory}", f"--kubeconfig={sandbox.kubeconfig}",
        "--kernel=6.8.0-45-generic", "--label=example.com/role=gpu", "--fake-module=fakemod=2",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:

        async def ready() -> bool:
            try:
                node = await kmm_api.request("GET", resources.NODES.path(name=name))
            except kube_errors.NotFound:
                return False
            conditions = (node.get("status") or {}).get("conditions") or ()
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await testing.eventually(ready, "the emulated node Ready")
        node = await kmm_api.request("GET", resources.NODES.path(name=name))
        assert node["status"]["nodeInfo"]["kernelVersion"] == "6.8.0-45-generic"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        assert node["metadata"]["labels"]["example.com/role"] == "gpu"
        assert sorted(p.name for p in (directory / "sys/class/fakemod").iterdir()) == [
            "fakemod0",
            "fakemod1",
        ]
        assert (directory / "dev/fakemod1").exists()

        async def leased() -> bool:
            try:
                lease = await kmm_api.request("GET", resources.LEASES.path("kube-node-lease", name))
            except kube_errors.NotFound:
                return False
            return bool(lease["spec"]["holderIdentity"] == name)

        await testing.eventually(leased, "the node's heartbeat Lease")
        process.terminate()
        assert process.stderr is not None
        output = await asyncio.wait_for(process.stderr.read(), timeout=60)
        assert await process.wait() == 0, output.decode()
        assert b"kubelet emulator stopped" in output
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        with contextlib.suppress(kube_errors.NotFound):
            await kmm_api.request("DELETE", resources.NODES.path(name=name))
        shutil.rmtree(directory, ignore_errors=True)


async def test_restart_keeps_pods_reprepare_prepares_again_and_reboot_rebuilds_cdi_specs(
    new_driver: NewDriver, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api, metrics_port=0) as (node, running),
        real.running(new_driver(node), kmm_api) as driver,
    ):
        template = await real._template(kmm_api, driver)
        pod = f"r-{driver.module}"
        await real.start_pod(
            kmm_api, pod, [{"name": "dev", "resourceClaimTemplateName": template}], **_on(node)
        )
        before = await kmm_api.request("GET", resources.PODS.path(NAMESPACE, pod))
        (spec_path,) = real._cdi_specs(node, driver)
        spec = spec_path.read_text()
        registered = driver.registrations()

        def prepares() -> int:
            return running.manager.count("NodePrepareResources")

        async def prepared_again(count: int) -> bool:
            return prepares() == count

        attempts = pod_operations(running, "PrepareResources")
        assert attempts > 0  # the count that must not move counted the pod's prepare
        await running.restart()
        # Passes of the pod loop wait for the restart: the next one is the
        # first to see the restarted state.
        syncs = pod_syncs(running)
        await testing.eventually(real._registered(driver, registered), "registered again")
        await testing.eventually(lambda: real._published(kmm_api, driver), "republished")

        async def synced() -> bool:
            return pod_syncs(running) > syncs

        await testing.eventually(synced, "a pod sync after the restart")
        # Not even an attempt (one that failed for want of the driver counts).
        assert pod_operations(running, "PrepareResources") == attempts
        assert prepares() == 1  # as in 1.35: a running pod's sandbox survives, no prepare
        after = await kmm_api.request("GET", resources.PODS.path(NAMESPACE, pod))
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert [s["restartCount"] for s in after["status"]["containerStatuses"]] == [0]

        await running.restart(reprepare=True)
        await testing.eventually(lambda: prepared_again(2), "prepared again (reprepare)")
        assert spec_path.read_text() == spec  # idempotent: the same devices

        # A reboot restarts the driver too: what it kept in memory is gone,
        # and so is the CDI directory (a tmpfs), which it must rebuild.
        await driver.kill()
        await running.restart(reboot=True)
        assert not spec_path.exists()
        await driver.start()
        await testing.eventually(lambda: prepared_again(3), "prepared again after the reboot")
        assert spec_path.read_text() == spec  # the wiped CDI spec rebuilt

        assert running.metrics_server is not None
        await running.metrics_server.bound.wait()
        url = f"http://127.0.0.1:{running.metrics_server.port}/metrics"
        scraped = (
            await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        ).decode()
        assert (
            f'kmm_kubelet_dra_operations_total{{driver="{driver.name}",'
            f'operation="NodePrepareResources",result="ok"}} 3.0'
        ) in scraped
        await real._delete_pod(kmm_api, pod)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared")


async def _allocated_status(api: kube_client.Client, pod: str) -> list[dict[str, Any]]:
    state = await real._pod_state(api, pod)
    statuses = ((state or {}).get("status") or {}).get("containerStatuses") or [{}]
    found: list[dict[str, Any]] = statuses[0].get("allocatedResourcesStatus") or []
    return found


async def test_device_health_reaches_the_pod_status_and_goes_unknown_with_the_driver(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api, resource_health=True, health_retry=0.5) as (node, _),
        real.running_driver(sandbox, node, kmm_api) as driver,
    ):
        template = await real._template(kmm_api, driver)
        pod = f"h-{driver.module}"
        await real.start_pod(
            kmm_api, pod, [{"name": "dev", "resourceClaimTemplateName": template}], **_on(node)
        )
        (claim,) = _claims(node)
        (device,) = (claim.driver_state or {})[driver.name]
        (cdi_id,) = device.cdi_device_ids or ()

        async def health_is(state: str, words: str = "") -> bool:
            # As a 1.37 kubelet writes it: the driver's message too
            # (ResourceHealthStatusMessage), where it gave one.
            found = await _allocated_status(kmm_api, pod)
            resources = [r for entry in found for r in entry.get("resources") or ()]
            return (
                [entry["name"] for entry in found] == ["claim:dev"]
                and [(r["resourceID"], r["health"]) for r in resources] == [(cdi_id, state)]
                and all(words in r.get("message", "") for r in resources)
            )

        await testing.eventually(lambda: health_is("Healthy"), "the device Healthy in the pod")
        state_file = json.loads((node.kubelet_dir / "dra_health_state").read_text())
        reported = state_file[driver.name]["Devices"][f"{node.name}/{device.device_name}"]
        assert reported["Health"] == "Healthy"

        (node.root / "dev" / device.device_name).unlink()  # the device disappears
        await testing.eventually(
            lambda: health_is("Unhealthy", device.device_name),
            "the device Unhealthy in the pod, with the driver's message",
            bound=60,
        )
        assert driver.process is not None
        driver.process.kill()  # its stream ends with it
        await driver.process.wait()
        await testing.eventually(lambda: health_is("Unknown"), "the device Unknown in the pod")
        await driver.start()  # to unprepare
        await real._delete_pod(kmm_api, pod)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared")


async def test_the_test_drivers_health_stream_is_followed_and_its_silent_devices_read_unknown(
    sandbox: testing.RunningSandbox, test_driver_binary: Path, kmm_api: kube_client.Client
) -> None:
    async with (
        emulated(kmm_api, resource_health=True, health_retry=0.5) as (node, _),
        real.running(k8s_test_driver.TestDriver(sandbox, node, test_driver_binary), kmm_api) as (
            driver
        ),
    ):
        template = await real._template(kmm_api, driver)
        pod = f"h-{driver.module}"
        await real.start_pod(
            kmm_api, pod, [{"name": "dev", "resourceClaimTemplateName": template}], **_on(node)
        )
        (claim,) = _claims(node)
        (device,) = (claim.driver_state or {})[driver.name]

        async def unknown() -> bool:
            return await _allocated_status(kmm_api, pod) == [
                {
                    "name": "claim:dev",
                    "resources": [
                        {"resourceID": (device.cdi_device_ids or ())[0], "health": "Unknown"}
                    ],
                }
            ]

        await testing.eventually(unknown, "the silent device Unknown in the pod")
        # The 1.37 test driver lists DRAResourceHealth v1 first, which a 1.37
        # kubelet (and so the emulator) prefers to v1alpha1.
        assert driver.said("/v1.DRAResourceHealth/NodeWatchResources") > 0
        assert driver.said("/v1alpha1.DRAResourceHealth/NodeWatchResources") == 0
        await real._delete_pod(kmm_api, pod)
        await testing.eventually(lambda: _unprepared(node, driver), "unprepared")


async def test_pods_deleted_after_a_failed_prepare_leave_no_retry_behind(
    kmm_api: kube_client.Client,
) -> None:
    """A pod whose prepare fails waits for its retry; deleted, gracefully or
    by force, it must not leave that retry in the long-running emulator."""
    async with emulated(kmm_api) as (node, running):
        for cycle in range(6):
            name = f"nt-{uuid.uuid4().hex[:6]}"
            body = real._pod(name, [{"name": "dev", "resourceClaimName": f"absent-{name}"}])
            body["spec"].pop("nodeSelector")
            body["spec"]["terminationGracePeriodSeconds"] = 30
            body["spec"]["nodeName"] = node.name  # bound without the scheduler: the claim is absent
            created = await kmm_api.request("POST", resources.PODS.path(NAMESPACE), body=body)
            uid = created["metadata"]["uid"]

            async def failed(uid: str = uid) -> bool:
                return uid in running.workers.next_try

            await testing.eventually(failed, f"{name}: its prepare failed, a retry due")
            force = cycle % 2 == 1
            await real._delete_pod(kmm_api, name, force=force)
            if not force:
                # The emulator deleted it for good, which it does after forgetting it.
                assert uid not in running.workers.next_try

        async def no_retries() -> bool:
            return not running.workers.next_try

        await testing.eventually(no_retries, "no retry left for pods that are gone")
