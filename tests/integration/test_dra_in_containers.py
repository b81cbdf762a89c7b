"""DRA end to end in real containers: kmm's image as a DRA Module's driver.

One sandbox for the module: a container node (containerd, runc, CNI) that
shows kernel module ``kmmdemo`` as loaded with two devices
(``--fake-module``: ``/sys/class/kmmdemo``, ``/sys/module/kmmdemo`` and the
character devices ``/dev/kmmdemo0``, ``/dev/kmmdemo1`` in its mount
namespace only), and the registry. kmm's image (``make image``) and the
workload image (``make test-images``) are pushed with ``kmm sandbox push``
and pulled by the node's containerd. The operator runs in the test process;
what runs in containers is the driver DaemonSet's ``kmm driver`` and the
workload.

Everything is read as a user reads it: the driver's registration in the
kubelet's plugin registry (the node's directory), its ResourceSlice, the
workload's own log through the API server (``pods/log``), the CDI spec in the
node's ``/var/run/cdi``.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import pytest
import test_operator_support as support
from prometheus_client.parser import text_string_to_metric_families

from kmm.api import examples, installation, labels
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.sandbox import cluster, namespaces, testing
from kmm.sandbox.containernodes import nodes as containernodes

# In `make test-compat`: kmm on each supported Kubernetes release.
pytestmark = pytest.mark.compat

IMAGES = Path("build/images")
KMM_IMAGE = Path("build/kmm-image.tar")
NAMESPACE = "default"
NODE = "kmm-kubelet-0"
MODULE = examples.DRA_MODULE
DRIVER = "kmm-dra-demo.kmm.io"  # the example's
SELECT = "kmm-dra-in-containers"
_KMM = Path(sys.executable).with_name("kmm")


@pytest.fixture(scope="module")
def containers() -> Iterator[cluster.state.SandboxState]:
    with containersandbox.started("kd", kubelet_nodes=1, fake_modules=((MODULE, 2),)) as record:
        yield record


@pytest.fixture(scope="module")
def images(containers: cluster.state.SandboxState) -> dict[str, str]:
    return {
        "kmm": containersandbox.push(containers.directory, KMM_IMAGE, "kmm/kmm:test"),
        "workload": containersandbox.push(
            containers.directory, IMAGES / "workload.tar", "workload:1"
        ),
    }


@pytest.fixture
async def api(containers: cluster.state.SandboxState) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(containers.kubeconfig) as found:
        yield found


def node_of(record: cluster.state.SandboxState) -> containernodes.ContainerNode:
    found = containernodes.load(record.directory / "kubelets" / "0")
    assert found is not None
    return found


def driver_objects(image: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The driver's ServiceAccount and RBAC, and the DRA Module, as
    deploy/examples/dra-module.yaml has them (built by the same code), with
    the image pushed here, the test's own selector and ``env`` added to the
    driver container's."""
    module = examples.dra_module(namespace=NAMESPACE, selector={SELECT: "yes"})
    module["spec"]["dra"]["container"]["image"] = image
    if env:
        container = module["spec"]["dra"]["container"]
        container["env"] = [
            *container.get("env", []),
            *({"name": name, "value": value} for name, value in env.items()),
        ]
    assert module["spec"]["dra"]["driverName"] == DRIVER
    return [*installation.dra_driver_rbac(NAMESPACE), module]


def workload(name: str, image: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "device", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    # The modes of the module's devices first, then the image's own
                    # entrypoint (its KMM-WORKLOAD lines).
                    "command": [
                        "sh",
                        "-c",
                        f"stat -c 'KMM-TEST mode %n %a' /dev/{MODULE}*; exec /entrypoint",
                    ],
                    "resources": {"claims": [{"name": "device"}]},
                }
            ],
        },
    }


def claim_template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": DRIVER}}]}
            }
        },
    }


async def _pod(api: kube_client.Client, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await api.request(
            "GET", resources.PODS.path(namespace=NAMESPACE, name=name)
        )
    except kube_errors.NotFound:
        return None
    return found


async def _driver_pod(api: kube_client.Client) -> dict[str, Any] | None:
    listing = await api.request(
        "GET",
        resources.PODS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.ROLE}=dra"},
    )
    return next(iter(listing["items"]), None)


def _ready(pod: dict[str, Any] | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def _describe(api: kube_client.Client, name: str) -> str:
    """A pod's status and events, for a failure message."""
    pod = await _pod(api, name)
    events = await api.request(
        "GET",
        resources.EVENTS.path(namespace=NAMESPACE),
        query={"fieldSelector": f"involvedObject.name={name}"},
    )
    said = "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events["items"])
    return f"{name}: {(pod or {}).get('status')}; events: {said}"


async def _log(api: kube_client.Client, name: str) -> str:
    path = resources.PODS.path(namespace=NAMESPACE, name=name) + "/log"
    return str(await api.request("GET", path) or "")


@contextlib.asynccontextmanager
async def dra_module(
    record: cluster.state.SandboxState,
    api: kube_client.Client,
    image: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The operator (in this process) and the DRA Module (its driver given
    ``env``); yields the driver pod once it is Ready in its container."""
    await support.install_manifests(record.kubeconfig)
    await api.request(
        "PATCH",
        resources.NODES.path(name=NODE),
        body={"metadata": {"labels": {SELECT: "yes"}}},
        content_type="application/merge-patch+json",
    )
    docs = driver_objects(image, env)
    async with support.operator_in_process(record.kubeconfig):
        await applying.apply_documents(api, docs)
        try:
            found: dict[str, Any] = {}

            async def driver_ready() -> bool:
                pod = await _driver_pod(api)
                found["pod"] = pod
                return _ready(pod)

            try:
                await testing.eventually(driver_ready, "the driver pod Ready", bound=240)
            except AssertionError as err:
                pod = found.get("pod")
                name = (pod or {}).get("metadata", {}).get("name", "?")
                detail = await _describe(api, name)
                log = await _log(api, name) if pod else ""
                raise AssertionError(f"{err}: {detail}\nlog:\n{log}") from err
            yield found["pod"]
        finally:
            with contextlib.suppress(kube_errors.NotFound):
                await api.request("DELETE", _module_path())

            async def module_gone() -> bool:
                try:
                    await api.request("GET", _module_path())
                except kube_errors.NotFound:
                    return True
                return False

            # Gone before the operator stops (its finalizer), so the next test
            # creates the Module anew.
            await testing.eventually(module_gone, "the Module deleted", bound=120)


def _module_path() -> str:
    return f"/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/modules/kmm-dra-demo"


async def _probes(api: kube_client.Client, result: str) -> float:
    """The driver container's liveness probes with ``result`` the node's
    kubelet counted (its /metrics/probes, through the API server)."""
    text = await api.request("GET", resources.NODES.path(name=NODE) + "/proxy/metrics/probes")
    total = 0.0
    for family in text_string_to_metric_families(str(text)):
        for sample in family.samples:
            if (
                sample.name == "prober_probe_total"
                and sample.labels.get("container") == "dra-driver"
                and sample.labels.get("probe_type") == "Liveness"
                and sample.labels.get("result") == result
            ):
                total += sample.value
    return total


async def test_a_workload_gets_the_module_device_the_driver_in_a_container_prepared(
    containers: cluster.state.SandboxState, images: dict[str, str], api: kube_client.Client
) -> None:
    node = node_of(containers)
    async with dra_module(containers, api, images["kmm"]) as driver_pod:
        try:
            await _workload_round(containers, api, images, driver_pod)

            # The kubelet's gRPC liveness probe reached the driver in its container.
            async def probed() -> bool:
                return await _probes(api, "successful") > 0

            await testing.eventually(probed, "a successful liveness probe", bound=60)
            assert await _probes(api, "failed") == 0
        except AssertionError as err:
            driver_log = await _log(api, driver_pod["metadata"]["name"])
            raise AssertionError(f"{err}\ndriver log:\n{driver_log}") from err

        # The Module deleted: the operator deletes the DaemonSet, and the
        # driver, stopped by SIGTERM as its container's PID 1, removes its sockets.
        await api.request("DELETE", _module_path())

        async def driver_gone() -> bool:
            return await _driver_pod(api) is None

        await testing.eventually(driver_gone, "the driver pod gone", bound=120)
        kubelet_dir = node.source("/var/lib/kubelet")
        assert not (kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
        assert not (kubelet_dir / "plugins" / DRIVER / "dra.sock").exists()


async def _registered(node: containernodes.ContainerNode) -> None:
    """Wait for the driver's registration socket in the node's own plugin
    registry, where the real kubelet's plugin watcher finds it."""
    registry_dir = node.source("/var/lib/kubelet") / "plugins_registry"

    async def registering() -> bool:
        return (registry_dir / f"{DRIVER}-reg.sock").is_socket()

    await testing.eventually(registering, "the driver's registration socket", bound=120)


async def _workload_round(
    containers: cluster.state.SandboxState,
    api: kube_client.Client,
    images: dict[str, str],
    driver_pod: dict[str, Any],
    *,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """A workload gets a device; ``meanwhile`` runs while it holds it; its
    deletion unprepares the claim."""
    node = node_of(containers)
    cdi_dir = node.source("/var/run/cdi")
    assert driver_pod["spec"]["nodeName"] == NODE
    await _registered(node)

    found: dict[str, Any] = {}

    async def published() -> bool:
        listing = await api.request(
            "GET",
            resources.RESOURCE_SLICES.path(),
            query={"fieldSelector": f"spec.nodeName={NODE},spec.driver={DRIVER}"},
        )
        found.update({d["name"]: d for s in listing["items"] for d in s["spec"]["devices"]})
        return sorted(found) == [f"{MODULE}0", f"{MODULE}1"]

    await testing.eventually(published, "both devices in the driver's ResourceSlice")
    # What the driver read in the node's /sys and /dev, through its hostPaths.
    attributes = found[f"{MODULE}1"]["attributes"]
    assert {k: attributes[k] for k in ("module", "moduleVersion", "major", "minor")} == {
        "module": {"string": MODULE},
        "moduleVersion": {"string": "1.0"},
        "major": {"int": 240},
        "minor": {"int": 1},
    }

    suffix = uuid.uuid4().hex[:6]
    template, name = f"dev-{suffix}", f"workload-{suffix}"
    await applying.apply_documents(api, [claim_template(template)])
    await api.request(
        "POST",
        resources.PODS.path(namespace=NAMESPACE),
        body=workload(name, images["workload"], template),
    )

    async def said_ready() -> bool:
        pod = await _pod(api, name)
        if ((pod or {}).get("status") or {}).get("phase") != "Running":
            return False
        return "KMM-WORKLOAD ready" in await _log(api, name)

    try:
        await testing.eventually(said_ready, "the workload's log", bound=180)
    except AssertionError as err:
        raise AssertionError(f"{err}: {await _describe(api, name)}") from err
    log = (await _log(api, name)).splitlines()
    pod = await _pod(api, name)
    assert pod is not None
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = await api.request(
        "GET", resources.RESOURCE_CLAIMS.path(namespace=NAMESPACE, name=claim_name)
    )
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    number = int(device.removeprefix(MODULE))
    # The device node runc made from the CDI spec, with the node's numbers.
    assert f"KMM-WORKLOAD device /dev/{device} c 240:{number}" in log, log
    assert f"KMM-WORKLOAD env KMM_DEVICE_{device.upper()}=/dev/{device}" in log, log
    # The node's mode, which containerd reads from the spec's hostPath on the
    # node (a path in the driver's container is not there, and runc's default
    # would make the device anyone's).
    assert f"KMM-TEST mode /dev/{device} 600" in log, log
    specs = [p.name for p in cdi_dir.iterdir()]
    assert any(claim["metadata"]["uid"] in spec for spec in specs), specs

    if meanwhile is not None:
        await meanwhile()
    await api.request("DELETE", resources.PODS.path(namespace=NAMESPACE, name=name))

    async def gone() -> bool:
        return await _pod(api, name) is None

    await testing.eventually(gone, "the workload pod deleted", bound=120)
    # The kubelet unprepared the claim before the pod could go: its spec is gone.
    assert not any(claim["metadata"]["uid"] in p.name for p in cdi_dir.iterdir())


async def test_a_driver_pod_replaced_while_a_claim_is_prepared_unprepares_it(
    containers: cluster.state.SandboxState, images: dict[str, str], api: kube_client.Client
) -> None:
    # What a driver update or a crash does: a new container, the prepared
    # claim known only from the checkpoint in the node's plugin directory.
    node = node_of(containers)
    async with dra_module(containers, api, images["kmm"]) as driver_pod:
        first = driver_pod["metadata"]["uid"]
        current = driver_pod

        async def replace_the_driver() -> None:
            nonlocal current
            await api.request(
                "DELETE",
                resources.PODS.path(namespace=NAMESPACE, name=driver_pod["metadata"]["name"]),
            )

            async def replaced() -> bool:
                nonlocal current
                pod = await _driver_pod(api)
                if pod is None or pod["metadata"]["uid"] == first or not _ready(pod):
                    return False
                current = pod
                return True

            await testing.eventually(replaced, "a new driver pod Ready", bound=120)
            await _registered(node)

        try:
            await _workload_round(containers, api, images, driver_pod, meanwhile=replace_the_driver)
        except AssertionError as err:
            driver_log = await _log(api, current["metadata"]["name"])
            raise AssertionError(f"{err}\ndriver log:\n{driver_log}") from err
        assert current["metadata"]["uid"] != first
        assert "released" in await _log(api, current["metadata"]["name"])


def _in_node(record: cluster.state.SandboxState, script: str) -> None:
    """Run ``script`` in the node's mount namespace (where its /dev and
    /sys/module overlays are), as a node's root would."""
    holder = next(p.pid for p in record.launched if p.name == f"node/{NODE}")
    namespaces.run_in(namespaces.Holder(pid=holder, mount=True), ["sh", "-c", script], mount=True)


async def _device_health(api: kube_client.Client, name: str) -> list[tuple[str, str]]:
    """(health, message) of every resource in the workload's
    ``allocatedResourcesStatus``, as the kubelet wrote them."""
    pod = await _pod(api, name)
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or ()
    return [
        (resource.get("health", ""), resource.get("message", ""))
        for status in statuses
        for allocated in status.get("allocatedResourcesStatus") or ()
        for resource in allocated.get("resources") or ()
    ]


async def test_the_workload_sees_its_device_unhealthy_while_its_node_or_module_is_gone(
    containers: cluster.state.SandboxState, images: dict[str, str], api: kube_client.Client
) -> None:
    """Device health through the node's real kubelet (ResourceHealthStatus:
    on from 1.36, turned on by the sandbox for 1.35): the driver, told its
    kernel module (KMM_MODULE_NAME), reports the workload's device Unhealthy
    while its /dev node is gone and while the module is not loaded, and the
    kubelet writes it into the pod's status; Healthy again when each is back."""
    async with dra_module(
        containers, api, images["kmm"], env={"KMM_MODULE_NAME": MODULE}
    ) as driver_pod:

        async def health_round() -> None:
            listing = await api.request("GET", resources.PODS.path(namespace=NAMESPACE))
            (name,) = [
                p["metadata"]["name"]
                for p in listing["items"]
                if p["metadata"]["name"].startswith("workload-")
            ]
            pod = await _pod(api, name)
            assert pod is not None
            claim = await api.request(
                "GET",
                resources.RESOURCE_CLAIMS.path(
                    namespace=NAMESPACE,
                    name=pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"],
                ),
            )
            device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
            number = int(device.removeprefix(MODULE))
            seen: list[list[tuple[str, str]]] = []

            async def health_is(expected: str, words: str = "") -> None:
                async def reported() -> bool:
                    found = await _device_health(api, name)
                    seen.append(found)
                    # The message reaches the pod from 1.36 on
                    # (ResourceHealthStatusMessage); 1.35 writes none.
                    return bool(found) and all(
                        health == expected and (not message or words in message)
                        for health, message in found
                    )

                try:
                    await testing.eventually(reported, f"the device {expected}", bound=120)
                except AssertionError as err:
                    raise AssertionError(f"{err}: last seen {seen[-3:]}") from err

            await health_is("Healthy")
            _in_node(containers, f"rm /dev/{device}")
            await health_is("Unhealthy")
            _in_node(containers, f"mknod -m 600 /dev/{device} c 240 {number}")
            await health_is("Healthy")
            _in_node(containers, f"rm -r /sys/module/{MODULE}")
            await health_is("Unhealthy", f"kernel module {MODULE} is not loaded")
            _in_node(
                containers,
                f"mkdir /sys/module/{MODULE} && echo 1.0 > /sys/module/{MODULE}/version",
            )
            await health_is("Healthy")

        try:
            await _workload_round(containers, api, images, driver_pod, meanwhile=health_round)
        except AssertionError as err:
            driver_log = await _log(api, driver_pod["metadata"]["name"])
            raise AssertionError(f"{err}\ndriver log:\n{driver_log}") from err
