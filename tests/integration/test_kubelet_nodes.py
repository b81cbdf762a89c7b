"""``kmm driver`` against the real kubelet: the sandbox's kubelet nodes.

A kubelet built from the pinned module runs on the fake container runtime;
its DRA manager (plugin watcher, NodePrepareResources / Unprepare, its
``dra_manager_state`` checkpoint, ResourceSlice wiping) is the real one. The
driver runs as a process on a fake device tree under the node's root, as the
driver's own tests lay it out. Pods are scheduled by the real scheduler and
claims allocated by it; the fake runtime records the CDI devices each
container was created with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import ssl
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kmm.cli import paths
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.sandbox import addressing, cluster, components, namespaces, restarting, testing
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes

NODE = f"{kubeletnodes.NODE_PREFIX}0"


class Sandbox(Protocol):
    """A sandbox as the helpers use it: the session's or a kubelet-node one."""

    @property
    def kubeconfig(self) -> Path: ...


NAMESPACE = "default"


@pytest.fixture(scope="module")
def kubelet_sandbox() -> Iterator[cluster.state.SandboxState]:
    # Short: the kubelet's unix sockets live under it.
    directory = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    options = cluster.Options(
        directory=directory, cache_dir=paths.cache_dir(), nodes=0, kubelet_nodes=1
    )
    record = asyncio.run(cluster.up(options))
    try:
        yield record
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(kubelet_sandbox: cluster.state.SandboxState) -> kubeletnodes.KubeletNode:
    return cluster.kubelet_node(kubelet_sandbox.directory, NODE)


@pytest.fixture
async def api(kubelet_sandbox: cluster.state.SandboxState) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(kubelet_sandbox.kubeconfig) as found:
        yield found


def fake_tree(root: Path, module: str, count: int = 2) -> None:
    (root / "dev").mkdir(exist_ok=True)
    (root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
    (root / "sys/module" / module / "version").write_text("2.0\n")
    for i in range(count):
        entry = root / "sys/class" / module / f"{module}{i}"
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (root / "dev" / f"{module}{i}").write_text("")


class Node(Protocol):
    """What the driver helpers need of a node, real kubelet's or emulated."""

    @property
    def name(self) -> str: ...

    @property
    def directory(self) -> Path: ...

    @property
    def root(self) -> Path: ...

    @property
    def kubelet_dir(self) -> Path: ...

    @property
    def cdi_dir(self) -> Path: ...


class LoggedProcess:
    """A driver process and its log: what both drivers of the tests share."""

    log: Path
    process: asyncio.subprocess.Process | None = None

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()

    def said(self, text: str) -> int:
        return self.log.read_text().count(text) if self.log.exists() else 0


class Driver(LoggedProcess):
    """``kmm driver`` for one driver name on the node, as a process."""

    def __init__(self, sandbox: Sandbox, node: Node) -> None:
        self.sandbox, self.node = sandbox, node
        self.module = f"m{uuid.uuid4().hex[:6]}"
        self.name = f"{self.module}.kmm.io"
        self.log = node.directory / f"driver-{self.module}.log"
        fake_tree(node.root, self.module)

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from kmm.cli import main; main()", "driver",
                f"--node={self.node.name}", f"--driver-name={self.name}",
                f"--module={self.module}", f"--device-class={self.module}",
                f"--root={self.node.root}", f"--kubeconfig={self.sandbox.kubeconfig}",
                "--verbose",  # its debug log names every call it is asked
                stderr=log,
            )  # fmt: skip

    def registrations(self) -> int:
        """How often the kubelet told the driver it is registered."""
        return self.said("registered with the kubelet")


class DriverProcess(Protocol):
    """A DRA driver run as a process for one node: ``kmm driver`` or another."""

    name: str
    module: str  # a short unique word, for the names of the test's objects
    node: Node

    async def start(self) -> None: ...

    async def kill(self) -> None: ...

    async def stop(self) -> None: ...

    def registrations(self) -> int: ...


_D = TypeVar("_D", bound=DriverProcess)


def running_driver(
    sandbox: Sandbox, node: Node, api: kube_client.Client
) -> contextlib.AbstractAsyncContextManager[Driver]:
    """``kmm driver`` on the node, as ``running`` gives it."""
    return running(Driver(sandbox, node), api)


@contextlib.asynccontextmanager
async def running(driver: _D, api: kube_client.Client) -> AsyncIterator[_D]:
    """A driver started, published and registered, with a DeviceClass
    selecting its devices; all removed afterwards."""
    await driver.start()
    await api.request(
        "POST",
        resources.DEVICE_CLASSES.path(),
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver.name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver.name}"'}}]},
        },
    )
    try:
        await testing.eventually(lambda: _published(api, driver), "the driver's slice published")
        await testing.eventually(_registered(driver), "registered with the kubelet")
        yield driver
    finally:
        await driver.stop()
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resources.DEVICE_CLASSES.path(name=driver.name))
        for item in await _slices(api, driver):
            with contextlib.suppress(kube_errors.NotFound):
                await api.request(
                    "DELETE", resources.RESOURCE_SLICES.path(name=item["metadata"]["name"])
                )


async def _said(driver: Driver, text: str) -> bool:
    return driver.said(text) > 0


def _registered(driver: DriverProcess, more_than: int = 0) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return driver.registrations() > more_than

    return check


async def _no_specs(node: Node, driver: DriverProcess) -> bool:
    return not _cdi_specs(node, driver)


async def _slices(api: kube_client.Client, driver: DriverProcess) -> list[dict[str, Any]]:
    listing = await api.request(
        "GET",
        resources.RESOURCE_SLICES.path(),
        query={"fieldSelector": f"spec.nodeName={driver.node.name},spec.driver={driver.name}"},
    )
    found: list[dict[str, Any]] = listing["items"]
    return found


async def _published(api: kube_client.Client, driver: DriverProcess) -> bool:
    return bool(await _slices(api, driver))


def _pod(name: str, claims: list[dict[str, str]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {cluster.KUBELET_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": claims,
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/app:1",
                    "resources": {"claims": [{"name": c["name"]} for c in claims]},
                }
            ],
            **spec,
        },
    }


async def _create(api: kube_client.Client, path: str, body: dict[str, Any]) -> None:
    await api.request("POST", path, body=body)


async def _template(api: kube_client.Client, driver: DriverProcess) -> str:
    name = f"t-{driver.module}"
    await _create(
        api,
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "one", "exactly": {"deviceClassName": driver.name}}]
                    }
                }
            },
        },
    )
    return name


async def _claim(api: kube_client.Client, driver: DriverProcess) -> str:
    name = f"c-{driver.module}"
    await _create(
        api,
        resources.RESOURCE_CLAIMS.path(NAMESPACE),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "one", "exactly": {"deviceClassName": driver.name}}]
                }
            },
        },
    )
    return name


async def _pod_state(api: kube_client.Client, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await api.request("GET", resources.PODS.path(NAMESPACE, name))
    except kube_errors.NotFound:
        return None
    return found


async def start_pod(
    api: kube_client.Client, name: str, claims: list[dict[str, str]], **spec: Any
) -> dict[str, Any]:
    """Create a pod using ``claims`` (``spec`` overrides, e.g. a nodeSelector) and
    wait until it runs; its state then."""
    body = _pod(name, claims)
    body["spec"].update(spec)
    await _create(api, resources.PODS.path(NAMESPACE), body)
    await testing.eventually(lambda: _running(api, name), f"{name} Running", bound=120)
    state = await _pod_state(api, name)
    assert state is not None
    return state


async def _running(api: kube_client.Client, name: str) -> bool:
    pod = await _pod_state(api, name)
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


async def _delete_pod(api: kube_client.Client, name: str, *, force: bool = False) -> None:
    query: dict[str, Any] = {"gracePeriodSeconds": 0} if force else {}
    with contextlib.suppress(kube_errors.NotFound):
        await api.request("DELETE", resources.PODS.path(NAMESPACE, name), query=query)

    async def gone() -> bool:
        return await _pod_state(api, name) is None

    await testing.eventually(gone, f"pod {name} gone", bound=120)


def _checkpoint(node: Node) -> list[dict[str, Any]]:
    """The claims in the kubelet's own dra_manager_state."""
    path = node.kubelet_dir / "dra_manager_state"
    if not path.exists():
        return []
    inner = json.loads(json.loads(path.read_text())["Data"])
    found: list[dict[str, Any]] = inner["ClaimInfoStateList"]
    return found


def _containers(node: kubeletnodes.KubeletNode) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{node.cri_url}/containers", timeout=10) as reply:
        found: list[dict[str, Any]] = json.loads(reply.read())
    return found


def _cdi_specs(node: Node, driver: DriverProcess) -> list[Path]:
    return sorted(node.cdi_dir.glob(f"{driver.name}-*.json"))


async def test_version_and_kubelet_version_are_the_pinned_release(
    kubelet_sandbox: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    version = await api.request("GET", "/version")
    pinned = components.KUBERNETES.version
    assert version["gitVersion"] == pinned
    assert (version["major"], version["minor"]) == tuple(pinned[1:].split(".")[:2])
    assert version["gitTreeState"] == "clean"
    # The pinned commit, or empty where kubereleases does not know it.
    assert version["gitCommit"] == components.KUBERNETES.commit
    assert len(version["gitCommit"]) in (0, 40)
    node = await api.request("GET", resources.NODES.path(name=NODE))
    assert node["status"]["nodeInfo"]["kubeletVersion"] == pinned
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("fakeRuntime://")


def _kubelet_open(node: kubeletnodes.KubeletNode, path: str, pki_dir: Path | None) -> Any:
    """A GET on the kubelet's own API (as the admin when ``pki_dir``)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the kubelet's serving certificate is self-signed
    if pki_dir is not None:
        context.load_cert_chain(pki_dir / "admin.crt", pki_dir / "admin.key")
    return urllib.request.urlopen(
        f"https://127.0.0.1:{node.port}{path}", context=context, timeout=10
    )


def _kubelet_get(node: kubeletnodes.KubeletNode, path: str, pki_dir: Path | None = None) -> int:
    """The status of a GET on the kubelet's own API (as the admin when ``pki_dir``)."""
    try:
        with _kubelet_open(node, path, pki_dir) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def _kubelet_metrics(node: kubeletnodes.KubeletNode, pki_dir: Path) -> str:
    with _kubelet_open(node, "/metrics", pki_dir) as reply:
        text: str = reply.read().decode()
    return text


async def kubelet_count(
    node: kubeletnodes.KubeletNode, pki_dir: Path, name: str, **labels: str
) -> float | None:
    """The sum of the kubelet's samples ``name`` that carry ``labels`` (its
    ``/metrics``, read as the admin), 0 before any was counted; None while it
    does not answer (restarting). How tests know the kubelet had its turn: a
    counter of the work it did (pod syncs, DRA operations) moved."""
    try:
        text = await asyncio.to_thread(_kubelet_metrics, node, pki_dir)
    except OSError:  # refused, reset, or an HTTP error (urllib's are OSErrors)
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def kubelet_synced_a_pod(node: kubeletnodes.KubeletNode, pki_dir: Path) -> bool:
    """Whether a freshly started kubelet's pod workers synced a pod they found
    running (``create``: its first sync in this process, whose counters start
    at 0): then the SyncPod that would have created a sandbox, and prepared
    the pod's claims for it, has returned."""
    count = await kubelet_count(
        node, pki_dir, "kubelet_pod_worker_duration_seconds_count", operation_type="create"
    )
    return bool(count)


def test_the_kubelet_api_is_local_and_never_anonymous(
    kubelet_sandbox: cluster.state.SandboxState, node: kubeletnodes.KubeletNode
) -> None:
    assert _kubelet_get(node, "/pods") == 401
    # The admin's certificate: authenticated by the CA, authorized by the API server.
    assert _kubelet_get(node, "/pods", kubelet_sandbox.directory / "pki") == 200


async def test_the_kubelet_prepares_through_kmm_driver_and_unprepares_on_delete(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    async with running_driver(kubelet_sandbox, node, api) as driver:
        template = await _template(api, driver)
        pod = f"p-{driver.module}"
        await start_pod(api, pod, [{"name": "dev", "resourceClaimTemplateName": template}])
        (claimed,) = [c for c in _checkpoint(node) if driver.name in c["DriverState"]]
        (prepared,) = claimed["DriverState"][driver.name]["Devices"]
        cdi_ids = prepared["CDIDeviceIDs"]
        (spec_path,) = _cdi_specs(node, driver)
        spec = json.loads(spec_path.read_text())
        nodes_in_spec = [
            d["path"] for entry in spec["devices"] for d in entry["containerEdits"]["deviceNodes"]
        ]
        assert nodes_in_spec == [f"/dev/{prepared['DeviceName']}"]
        (container,) = [c for c in _containers(node) if c["pod"] == pod]
        assert container["cdiDevices"] == cdi_ids

        await _delete_pod(api, pod)

        async def unprepared() -> bool:
            return not _cdi_specs(node, driver) and not _checkpoint(node)

        await testing.eventually(unprepared, "spec removed, dra_manager_state empty")
        assert driver.said("released") == 1


async def test_a_shared_claim_is_unprepared_once_and_a_force_deleted_pod_too(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    async with running_driver(kubelet_sandbox, node, api) as driver:
        claim = await _claim(api, driver)
        pods = [f"a-{driver.module}", f"b-{driver.module}"]
        for pod in pods:
            await _create(
                api,
                resources.PODS.path(NAMESPACE),
                _pod(pod, [{"name": "dev", "resourceClaimName": claim}]),
            )
        for pod in pods:
            await testing.eventually(lambda p=pod: _running(api, p), f"{pod} Running", bound=120)
        (shared,) = _checkpoint(node)
        assert len(shared["PodUIDs"]) == 2
        assert driver.said("prepared") == 1
        second = await _pod_state(api, pods[1])
        assert second is not None
        pki_dir = kubelet_sandbox.directory / "pki"
        operation = {"operation_name": "UnprepareResources"}
        name = "dra_operations_duration_seconds_count"
        unprepared = await kubelet_count(node, pki_dir, name, **operation)
        assert unprepared is not None

        # The pod goes at once (grace 0): the kubelet's UnprepareResources for
        # it, counted once done, proves it decided about the shared claim.
        await _delete_pod(api, pods[0])

        async def first_unprepared() -> bool:
            count = await kubelet_count(node, pki_dir, name, **operation)
            return count is not None and count > unprepared

        await testing.eventually(first_unprepared, "the first pod's UnprepareResources", bound=120)
        (kept,) = _checkpoint(node)
        assert list(kept["PodUIDs"]) == [second["metadata"]["uid"]]
        assert _cdi_specs(node, driver)
        assert driver.said("released") == 0
        await _delete_pod(api, pods[1], force=True)

        async def unprepared() -> bool:
            return not _cdi_specs(node, driver) and not _checkpoint(node)

        await testing.eventually(unprepared, "unprepared once both pods are gone")
        assert driver.said("released") == 1
        await api.request("DELETE", resources.RESOURCE_CLAIMS.path(NAMESPACE, claim))


async def test_restarts_of_the_kubelet_and_of_the_driver_keep_running_pods(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    async with running_driver(kubelet_sandbox, node, api) as driver:
        template = await _template(api, driver)
        pod = f"r-{driver.module}"
        await start_pod(api, pod, [{"name": "dev", "resourceClaimTemplateName": template}])
        before = await _pod_state(api, pod)
        assert before is not None
        registered = driver.said("registered with the kubelet")
        spec_before = [p.read_text() for p in _cdi_specs(node, driver)]
        pki_dir = kubelet_sandbox.directory / "pki"
        prepares = ("dra_operations_duration_seconds_count", "PrepareResources")
        # The counter that must stay at 0 after the restart counted this pod's prepare.
        assert await kubelet_count(node, pki_dir, prepares[0], operation_name=prepares[1])

        # As `kmm sandbox restart kmm-kubelet-0` does: its kind restarts its kubelet.
        await restarting.restart_node(kubelet_sandbox.directory, NODE)

        async def registered_again() -> bool:
            return driver.said("registered with the kubelet") > registered

        await testing.eventually(registered_again, "registered with the new kubelet", bound=120)
        # The kubelet wipes the node's slices at startup; the driver republishes.
        await testing.eventually(lambda: _published(api, driver), "republished", bound=120)
        await testing.eventually(
            lambda: kubelet_synced_a_pod(node, pki_dir), "a pod synced after the restart", bound=120
        )
        # Not even an attempt (one that failed for want of the driver counts).
        assert await kubelet_count(node, pki_dir, prepares[0], operation_name=prepares[1]) == 0
        after = await _pod_state(api, pod)
        assert after is not None
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        statuses = after["status"]["containerStatuses"]
        assert [s["restartCount"] for s in statuses] == [0]
        assert [p.read_text() for p in _cdi_specs(node, driver)] == spec_before
        assert len([c for c in _containers(node) if c["pod"] == pod]) == 1

        # The driver SIGKILLed and started again: registered, the claim kept.
        await driver.kill()
        registered = driver.said("registered with the kubelet")
        await driver.start()
        await testing.eventually(registered_again, "the driver registered again", bound=120)
        assert [p.read_text() for p in _cdi_specs(node, driver)] == spec_before
        assert await _running(api, pod)
        await _delete_pod(api, pod)
        await testing.eventually(lambda: _no_specs(node, driver), "unprepared", bound=120)


async def test_slices_wiped_after_the_driver_stays_away_come_back_with_it(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    async with running_driver(kubelet_sandbox, node, api) as driver:
        await driver.kill()

        async def wiped() -> bool:
            return not await _published(api, driver)

        # The kubelet's delay is 30 s (pkg/kubelet/cm/dra: defaultWipingDelay).
        await testing.eventually(wiped, "the kubelet wiped the slices", bound=120)
        await driver.start()
        await testing.eventually(lambda: _published(api, driver), "republished", bound=120)


async def test_a_pod_naming_its_node_is_never_prepared(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    async with running_driver(kubelet_sandbox, node, api) as driver:
        template = await _template(api, driver)
        pod = f"n-{driver.module}"
        body = _pod(pod, [{"name": "dev", "resourceClaimTemplateName": template}], nodeName=NODE)
        del body["spec"]["nodeSelector"]
        await _create(api, resources.PODS.path(NAMESPACE), body)

        async def failed() -> bool:
            listing = await api.request(
                "GET",
                resources.EVENTS.path(NAMESPACE),
                query={"fieldSelector": f"involvedObject.name={pod}"},
            )
            return any(e["reason"] == "FailedPrepareDynamicResources" for e in listing["items"])

        await testing.eventually(failed, "FailedPrepareDynamicResources", bound=120)
        state = await _pod_state(api, pod)
        assert state is not None
        assert state["status"]["phase"] == "Pending"
        assert driver.said("prepared") == 0
        await _delete_pod(api, pod, force=True)


def _relay_stats(sandbox: cluster.state.SandboxState) -> dict[str, int]:
    (relay,) = [p for p in sandbox.launched if p.name == "relay"]
    url = relay.health_url.removesuffix("/healthz") + "/stats"
    with urllib.request.urlopen(url, timeout=10) as reply:
        found: dict[str, int] = json.loads(reply.read())
    return found


async def test_the_api_server_reaches_the_kubelet_through_the_relays_connect_proxy(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    # The node IP is the node's fabric address: nothing routes it on the
    # host, so only the relay's CONNECT proxy (dialling from the fabric) can
    # carry what the API server asks of the kubelet.
    found = await api.request("GET", resources.NODES.path(name=NODE))
    internal = [a["address"] for a in found["status"]["addresses"] if a["type"] == "InternalIP"]
    assert internal == [str(addressing.node_address(0))]
    pod = f"logs-{uuid.uuid4().hex[:8]}"
    await start_pod(api, pod, [])
    try:
        (container,) = [c for c in _containers(node) if c["pod"] == pod]
        # What the container "said", in the CRI log format the kubelet reads.
        Path(container["logPath"]).write_text(
            "2026-01-01T00:00:00.000000000Z stdout F hello through the relay\n"
        )
        text = await api.request("GET", resources.PODS.path(NAMESPACE, pod) + "/log")
        assert text == "hello through the relay\n"
        assert await api.request("GET", f"{resources.NODES.path(name=NODE)}/proxy/healthz") == "ok"
    finally:
        await _delete_pod(api, pod)
    assert _relay_stats(kubelet_sandbox)["connects"] >= 1


async def test_nodes_meet_the_api_server_on_the_gateway(
    kubelet_sandbox: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    port = urllib.parse.urlsplit(kubelet_sandbox.server).port
    path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"

    async def advertised() -> bool:
        found = await api.request("GET", path)
        addresses = [e["addresses"] for e in found.get("endpoints") or ()]
        ports = [p["port"] for p in found.get("ports") or ()]
        return addresses == [[str(addressing.GATEWAY)]] and ports == [port]

    await testing.eventually(advertised, "the kubernetes EndpointSlice names the gateway")
    # From inside the node's namespace the gateway is the API server, and its
    # serving certificate names the gateway.
    (holder,) = [p for p in kubelet_sandbox.launched if p.name == f"node/{NODE}"]
    context = ssl.create_default_context(cafile=str(kubelet_sandbox.directory / "pki" / "ca.crt"))
    with namespaces.socket_in(f"/proc/{holder.pid}/ns/net") as raw:
        raw.settimeout(30)
        raw.connect((str(addressing.GATEWAY), port))
        with context.wrap_socket(raw, server_hostname=str(addressing.GATEWAY)) as tls:
            tls.sendall(b"GET /version HTTP/1.1\r\nHost: kubernetes\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 ")
    assert f'"gitVersion": "{components.KUBELET.version}"'.encode() in answer


async def test_a_restarted_relay_serves_again(
    kubelet_sandbox: cluster.state.SandboxState,
    node: kubeletnodes.KubeletNode,
    api: kube_client.Client,
) -> None:
    # Its listeners come back on the same ports (some in TIME_WAIT) and its
    # unix socket at the same path; its counters start again at 0.
    await restarting.restart(kubelet_sandbox.directory, "relay")
    restarted = cluster.status(kubelet_sandbox.directory)
    assert _relay_stats(restarted)["connects"] == 0
    assert await api.request("GET", f"{resources.NODES.path(name=NODE)}/proxy/healthz") == "ok"
    assert _relay_stats(restarted)["connects"] >= 1
    assert _kubelet_get(node, "/pods", kubelet_sandbox.directory / "pki") == 200
