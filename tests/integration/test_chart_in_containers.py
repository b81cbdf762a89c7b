"""kmm's image, Helm chart and loader pods in real containers, as a user runs them.

One sandbox for the module: two container nodes (containerd, runc) and the
registry, asking for credentials (``--registry-auth``), so every pull goes
with a pull secret: the chart's ``imagePullSecrets`` for the operator, the
Module's ``imageRepoSecret`` for its loaders. ``build/kmm-image.tar`` (``make image``) and the loader test image
(``make test-images``) are pushed with ``kmm sandbox push``; ``helm
install`` of deploy/helm/kmm with that image runs the operator Deployment in
a namespace enforcing the ``restricted`` Pod Security level. Everything is
read as a user reads it: objects and pod logs through the API server, the
kubelet's prober metrics through the API server's node proxy. The checks
under the API are the node's own files (the firmware a loader copied) and
the uid of the operator's process on this host.

No kernel module is loaded: the loader image's ``modprobe`` records its
calls in the container's log (docs/development.md "Test images"). Three things the
product got wrong in a container are pinned here: a loader pod's main
process that ignored SIGTERM (exit 137 after the grace period; now 0), a
kubeconfig's client certificate that needed a writable /tmp (the chart's
root filesystem is read-only), and probe and metrics ports bound to IPv4
only. The image must be the work tree's (``make
image``): a stale one fails the module at once, saying so.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import helm_support
import pytest
import typer

from kmm import cli
from kmm.api import labels
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.oci import archive as oci_archive
from kmm.sandbox import cluster, components, namespaces, registry, state
from kmm.sandbox.containernodes import nodes as containernodes

IMAGES = Path("build/images")
KMM_IMAGE = Path("build/kmm-image.tar")
FIRMWARE = Path("scripts/test_images/loader/firmware")
RELEASE_NAMESPACE = "kmm-system"
# Loader pods are privileged (root, SYS_MODULE): the Module's namespace
# enforces no Pod Security level, the operator's enforces ``restricted``.
MODULE_NAMESPACE = "default"
NODES = [f"kmm-kubelet-{i}" for i in range(2)]
OPERATOR_SELECTOR = "app.kubernetes.io/name=kmm-operator"
DEPLOYMENTS = resources.Resource("apps", "v1", "deployments")
MODULES = resources.Resource("kmm.sigs.x-k8s.io", "v1beta1", "modules")
SERVICES = resources.Resource("", "v1", "services")
CONFIG_MAPS = resources.Resource("", "v1", "configmaps")
SECRETS = resources.Resource("", "v1", "secrets")
_KMM = Path(sys.executable).with_name("kmm")
# The registry asks for these: every pull needs its pull secret.
REGISTRY_AUTH = registry.Auth("kmm-test", "chart-in-containers")
PULL_SECRET = "registry-credentials"


@dataclasses.dataclass(frozen=True)
class Installed:
    record: state.SandboxState
    kmm_image: str
    loader_image: str


async def _release_namespace(kubeconfig: Path, directory: Path) -> None:
    """The release namespace, ``restricted`` enforced, with the sandbox CA in
    a ConfigMap for the chart's ``registryCA`` (the registry's issuer), and
    the registry's credentials as a pull secret there and in the Module's
    namespace (the chart's ``imagePullSecrets``, the Module's
    ``imageRepoSecret``)."""
    ca = directory / "pki" / "ca.crt"
    docker_config = (directory / "registry" / "auth.json").read_bytes()
    async with cluster.api_client(kubeconfig) as api:
        await api.request(
            "POST",
            resources.NAMESPACES.path(),
            body={
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": RELEASE_NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                },
            },
        )
        await api.request(
            "POST",
            CONFIG_MAPS.path(namespace=RELEASE_NAMESPACE),
            body={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "registry-ca"},
                "data": {"ca.crt": ca.read_text()},
            },
        )
        for namespace in (RELEASE_NAMESPACE, MODULE_NAMESPACE):
            await api.request(
                "POST",
                SECRETS.path(namespace=namespace),
                body={
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "kubernetes.io/dockerconfigjson",
                    "metadata": {"name": PULL_SECRET},
                    "data": {".dockerconfigjson": base64.b64encode(docker_config).decode()},
                },
            )


def _require_fresh(archive: Path) -> None:
    """Fail, saying what to run, unless ``archive`` was built from the work
    tree's sources (the digest ``make image`` records in a label): a stale
    image would test another kmm."""
    if not archive.is_file():
        pytest.fail(f"{archive} is missing: run `make image` (make test does) before pytest")
    with oci_archive.Archive(archive) as image:
        config_descriptor, *_layers = image.children(image.manifests[0])
        config = json.loads(image.blob(config_descriptor))
    recorded = (config.get("config", {}).get("Labels") or {}).get("kmm.image.inputs")
    done = subprocess.run(
        [sys.executable, "scripts/image_inputs.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    if recorded != done.stdout.strip():
        pytest.fail(
            f"{archive} is stale (built from other sources): run `make image` before pytest"
        )


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    _require_fresh(KMM_IMAGE)
    with containersandbox.started(
        "kh", kubelet_nodes=len(NODES), registry_auth=REGISTRY_AUTH
    ) as record:
        directory = record.directory
        kmm_image = containersandbox.push(directory, KMM_IMAGE, "kmm:chart")
        loader_image = containersandbox.push(directory, IMAGES / "loader.tar", "loader:1")
        asyncio.run(_release_namespace(record.kubeconfig, directory))
        repository, _colon, tag = kmm_image.rpartition(":")
        helm = helm_support.binary(components.HELM)
        done = helm_support.helm(
            helm,
            directory / "helm-home",
            "install",
            "kmm",
            str(helm_support.CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            str(record.kubeconfig),
            "--set",
            f"image.repository={repository},image.tag={tag},registryCA.configMap=registry-ca,"
            f"imagePullSecrets[0].name={PULL_SECRET}",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield Installed(record, kmm_image, loader_image)


@pytest.fixture
async def api(installed: Installed) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(installed.record.kubeconfig) as found:
        yield found


async def _until(check: Any, *, timeout: float = 300, interval: float = 0.5) -> Any:
    """``await check()`` until it answers something true; that answer."""
    async with asyncio.timeout(timeout):
        while True:
            if found := await check():
                return found
            await asyncio.sleep(interval)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return {}


async def _operator_pods(api: kube_client.Client) -> list[dict[str, Any]]:
    listing = await api.request(
        "GET",
        resources.PODS.path(namespace=RELEASE_NAMESPACE),
        query={"labelSelector": OPERATOR_SELECTOR},
    )
    return [pod for pod in listing["items"] if not pod["metadata"].get("deletionTimestamp")]


async def _available(api: kube_client.Client) -> list[dict[str, Any]]:
    """The operator's pods once its Deployment is Available with every replica."""

    async def check() -> list[dict[str, Any]] | None:
        deployment = await api.request(
            "GET", DEPLOYMENTS.path(namespace=RELEASE_NAMESPACE, name="kmm-operator")
        )
        status = deployment.get("status") or {}
        if (
            _condition(deployment, "Available").get("status") != "True"
            or status.get("availableReplicas") != deployment["spec"]["replicas"]
        ):
            return None
        pods = await _operator_pods(api)
        return pods if len(pods) == deployment["spec"]["replicas"] else None

    found: list[dict[str, Any]] = await _until(check)
    return found


def _process_of(container_id: str) -> int:
    """The host pid of a container's main process: the one whose cgroup is
    the container's (the kubelet's cgroupfs driver names it by its id)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            lines = (entry / "cgroup").read_text().splitlines()
            if any(line.endswith("/" + container_id) for line in lines):
                return int(entry.name)
    raise AssertionError(f"no process in the cgroup of container {container_id}")


def _uids(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no Uid line for pid {pid}")


# -- the operator, installed --------------------------------------------------


async def test_the_operator_deployment_is_available_as_non_root_containers(
    api: kube_client.Client, installed: Installed
) -> None:
    pods = await _available(api)
    assert {pod["spec"]["nodeName"] for pod in pods} <= set(NODES)
    for pod in pods:
        assert _condition(pod, "Ready")["status"] == "True"
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == installed.kmm_image
        assert "running" in status["state"]
        # The uid the process really runs as, on this host: the image's
        # user kmm (65532), which the chart names and `restricted` requires.
        pid = _process_of(status["containerID"].removeprefix("containerd://"))
        assert set(_uids(pid)) == {65532}
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [
            b"/opt/kmm/bin/kmm",
            b"operator",
        ]


async def test_a_pull_without_the_pull_secret_is_refused(
    api: kube_client.Client, installed: Installed
) -> None:
    """The registry asks for credentials: the pulls of every other test were
    made with the pull secrets the chart and the Module name."""
    name = "no-pull-secret"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": MODULE_NAMESPACE},
        "spec": {
            "nodeName": NODES[0],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                # Always: asks the registry even where the image is present.
                {"name": "main", "image": installed.loader_image, "imagePullPolicy": "Always"}
            ],
        },
    }
    path = resources.PODS.path(namespace=MODULE_NAMESPACE, name=name)
    await api.request("POST", resources.PODS.path(namespace=MODULE_NAMESPACE), body=body)
    try:

        async def refused() -> str | None:
            pod = await api.request("GET", path)
            for status in (pod.get("status") or {}).get("containerStatuses") or ():
                waiting = (status.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                    return str(waiting.get("message", ""))
            return None

        message = await _until(refused)
        events = await api.request(
            "GET",
            resources.EVENTS.path(namespace=MODULE_NAMESPACE),
            query={"fieldSelector": f"involvedObject.name={name}"},
        )
        said = message + " ".join(event.get("message", "") for event in events["items"])
        assert "authorization failed: no basic auth credentials" in said, said
    finally:
        await api.request("DELETE", path)


async def test_one_operator_pod_holds_the_lease(api: kube_client.Client) -> None:
    pods = {pod["metadata"]["name"] for pod in await _available(api)}

    async def holder() -> str | None:
        lease = await api.request(
            "GET", resources.LEASES.path(namespace=RELEASE_NAMESPACE, name="kmm-operator")
        )
        name = (lease.get("spec") or {}).get("holderIdentity")
        return str(name) if name else None

    assert await _until(holder) in pods


def _probe_counts(text: str, pod: str) -> dict[tuple[str, str], float]:
    """``prober_probe_total`` of the kubelet's /metrics/probes for one pod:
    (probe type, result) -> count."""
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("prober_probe_total{") or f'pod="{pod}"' not in line:
            continue
        series, value = line.rsplit(" ", 1)
        fields = dict(
            part.split("=", 1)
            for part in series.removeprefix("prober_probe_total{")[:-1].split(",")
        )
        key = (fields["probe_type"].strip('"'), fields["result"].strip('"'))
        counts[key] = float(value)
    return counts


async def test_the_probes_pass_through_the_real_kubelet(api: kube_client.Client) -> None:
    for pod in await _available(api):
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        # Ready: the kubelet's readiness probe of /readyz on the health port passed.
        assert _condition(pod, "Ready")["status"] == "True"

        async def probed(name: str = name, node: str = node) -> dict[tuple[str, str], float]:
            text = await api.request("GET", f"/api/v1/nodes/{node}/proxy/metrics/probes")
            counts = _probe_counts(str(text), name)
            return counts if counts.get(("Liveness", "successful"), 0) >= 1 else {}

        # The kubelet's probe of /healthz passed: its counter moved. (A first
        # probe may fail before the port is bound, readiness's as well: not
        # counted against it.)
        counts = await _until(probed)
        assert counts.get(("Readiness", "successful"), 0) >= 1, counts


def _get_in_pod_network(pid: int, family: int, address: str, port: int, path: str) -> str:
    """An HTTP GET from inside the network namespace of process ``pid`` (a
    pod's): the status line, or the error the connection met."""
    with namespaces.socket_in(f"/proc/{pid}/ns/net", family) as connection:
        connection.settimeout(30)
        try:
            connection.connect((address, port))
        except OSError as err:
            return f"{type(err).__name__}: {err}"
        connection.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        return connection.makefile("rb").readline().decode().strip()


async def test_the_probe_and_metrics_ports_answer_on_ipv6_too(api: kube_client.Client) -> None:
    """A kubelet on an IPv6 or dual-stack cluster probes the pod's IPv6
    address, and Prometheus scrapes it: the operator must listen there as
    well as on IPv4 (this sandbox's pod network is IPv4, so the pod's own
    IPv6 loopback stands for it)."""
    for pod in await _available(api):
        (status,) = pod["status"]["containerStatuses"]
        pid = _process_of(status["containerID"].removeprefix("containerd://"))
        for port, path in ((8081, "/healthz"), (8080, "/metrics")):
            for family, address in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
                answer = await asyncio.to_thread(
                    _get_in_pod_network, pid, family, address, port, path
                )
                assert answer == "HTTP/1.0 200 OK", (address, port, answer)


# -- a Module, converged by the installed operator ------------------------------

ORDER = ["kmm_ci_a", "kmm_ci_b"]
DIR_NAME = "/opt/kmm-ci"
PARAMETERS = ["debug=1", "mode=fast"]
IN_TREE = ["kmm_ci_a_intree"]
SOFTDEP = {"/etc/modprobe.d/softdep.conf": "softdep kmm_ci_a pre: kmm_ci_b\n"}


def _module(kernels: set[str], image: str) -> dict[str, Any]:
    return {
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": "kmm-ci-a", "namespace": MODULE_NAMESPACE},
        "spec": {
            "selector": {"kubernetes.io/os": "linux"},
            "imageRepoSecret": {"name": PULL_SECRET},
            "moduleLoader": {
                "container": {
                    "modprobe": {
                        "moduleName": ORDER[0],
                        "dirName": DIR_NAME,
                        "parameters": PARAMETERS,
                        "firmwarePath": "/firmware",
                        "modulesLoadingOrder": ORDER,
                    },
                    "kernelMappings": [
                        # Each node's real kernel, mapped to the test image.
                        {
                            "literal": kernel,
                            "containerImage": image,
                            "inTreeModulesToRemove": IN_TREE,
                        }
                        for kernel in sorted(kernels)
                    ],
                }
            },
        },
    }


def _modprobe_calls(log: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("KMM-MODPROBE "))
        for line in log.splitlines()
        if line.startswith("KMM-MODPROBE ")
    ]


async def _loader_pods(api: kube_client.Client) -> list[dict[str, Any]]:
    listing = await api.request(
        "GET",
        resources.PODS.path(namespace=MODULE_NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}=kmm-ci-a"},
    )
    return list(listing["items"])


@contextlib.asynccontextmanager
async def _following(
    kubectl: Path, kubeconfig: Path, pod: str, lines_before: int
) -> AsyncIterator[asyncio.Task[str]]:
    """``kubectl logs --follow``, attached (its first ``lines_before``
    modprobe lines read) when this enters: a task answering the container's
    whole log once the stream ends, which it does when the container exits."""
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        MODULE_NAMESPACE,
        "logs",
        "--follow",
        pod,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    read: list[str] = []
    while len(_modprobe_calls("".join(read))) < lines_before:
        line = (await process.stdout.readline()).decode()
        assert line, (await process.stderr.read()).decode()
        read.append(line)

    async def rest() -> str:
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        return "".join(read) + out.decode()

    task = asyncio.create_task(rest())
    try:
        yield task
    finally:
        if not task.done():
            process.kill()
            with contextlib.suppress(BaseException):
                await task


async def _terminated_states(
    api: kube_client.Client, names: set[str], resource_version: str
) -> dict[str, dict[str, Any]]:
    """Watch the pods ``names`` until each is deleted: the terminated state
    each container last reported (the kubelet writes it before the pod goes)."""
    states: dict[str, dict[str, Any]] = {}
    gone: set[str] = set()
    version = resource_version
    while gone != names:
        async for event in api.watch(
            resources.PODS.path(namespace=MODULE_NAMESPACE),
            query={"resourceVersion": version},
            timeout_seconds=120,
        ):
            obj = event["object"]
            version = obj["metadata"].get("resourceVersion") or version
            name = obj["metadata"].get("name")
            if event["type"] == "BOOKMARK" or name not in names:
                continue
            for status in (obj.get("status") or {}).get("containerStatuses") or ():
                if "terminated" in (status.get("state") or {}):
                    states[name] = status["state"]["terminated"]
            if event["type"] == "DELETED":
                gone.add(name)
            if gone == names:
                break
    return states


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return helm_support.binary(components.KUBECTL)


async def test_the_module_loads_and_unloads_in_containers_as_it_says(
    api: kube_client.Client, installed: Installed, kubectl: Path
) -> None:
    await _available(api)
    listing = await api.request("GET", resources.NODES.path())
    kernels = {node["status"]["nodeInfo"]["kernelVersion"] for node in listing["items"]}
    module_path = MODULES.path(namespace=MODULE_NAMESPACE)
    await api.request("POST", module_path, body=_module(kernels, installed.loader_image))
    name_path = MODULES.path(namespace=MODULE_NAMESPACE, name="kmm-ci-a")

    async def converged() -> bool:
        module = await api.request("GET", name_path)
        loader = (module.get("status") or {}).get("moduleLoader") or {}
        return _condition(module, "Ready").get("status") == "True" and loader.get(
            "availableNumber"
        ) == len(NODES)

    await _until(converged)
    ready_label = labels.ready(MODULE_NAMESPACE, "kmm-ci-a")
    # The operator labelled the nodes (the chart's RBAC lets it patch them).
    for node in (await api.request("GET", resources.NODES.path()))["items"]:
        assert ready_label in node["metadata"]["labels"]
        assert node["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == labels.kernel_value(
            node["status"]["nodeInfo"]["kernelVersion"]
        )
    pods = await _loader_pods(api)
    assert sorted(pod["spec"]["nodeName"] for pod in pods) == sorted(NODES)
    # The node's kernel has no module support: no in-tree module can be
    # loaded, so none is removed, and nothing is compared; the loader says
    # so in its log (loader.scripts), and runs the load as the Module says.
    load = [{"argv": ["-v", "-d", DIR_NAME, ORDER[0], *PARAMETERS], "modprobe.d": SOFTDEP}]
    for pod in pods:
        assert _condition(pod, "Ready")["status"] == "True"
        log = await api.request(
            "GET",
            resources.PODS.path(namespace=MODULE_NAMESPACE, name=pod["metadata"]["name"]) + "/log",
        )
        assert _modprobe_calls(str(log)) == load
        for said in (
            f"kmm-loader: in-tree modules {' '.join(IN_TREE)}: not verifiable, the kernel has "
            "no module support (no /proc/modules): none is loaded",
            f"kmm-loader: {ORDER[0]}: not verifiable, the kernel has no module support",
        ):
            assert said in str(log), log

    # kmm's CLI in a container (the chart's settings: read-only root) finds
    # the cluster as a pod does (the ServiceAccount's token, the kubernetes
    # Service; the chart's account may list Modules), and with a kubeconfig
    # holding a client certificate, which Python's ssl loads from files only.
    await _kubeconfig_secret(api, installed.record.directory / "pki")
    ran = await _ran(
        api,
        "kmm-modules",
        installed.kmm_image,
        {
            "in-cluster": {"args": ["modules"]},
            "kubeconfig": {
                "args": ["modules", "--kubeconfig", "/kubeconfig/config"],
                "volumeMounts": [{"name": "kubeconfig", "mountPath": "/kubeconfig"}],
            },
        },
        serviceAccountName="kmm-operator",
        volumes=[{"name": "kubeconfig", "secret": {"secretName": "admin-kubeconfig"}}],
    )
    for code, log in ran.values():
        assert code == 0, log
        assert "kmm-ci-a" in log, log

    # The firmware landed in each node's own /lib/firmware, not this host's.
    expected = (FIRMWARE / "kmm-test" / "fw.bin").read_bytes()
    for index in range(len(NODES)):
        node = containernodes.load(installed.record.directory / "kubelets" / str(index))
        assert node is not None
        assert (node.source("/lib/firmware") / "kmm-test" / "fw.bin").read_bytes() == expected
    assert not Path("/lib/firmware/kmm-test").exists()

    # Delete the Module: each loader pod's preStop unloads; its lines reach
    # the container's log before the container exits, so a log followed from
    # before the deletion has them.
    names = {pod["metadata"]["name"] for pod in pods}
    version = (await api.request("GET", resources.PODS.path(namespace=MODULE_NAMESPACE)))[
        "metadata"
    ]["resourceVersion"]
    async with contextlib.AsyncExitStack() as stack:
        follows = {
            name: await stack.enter_async_context(
                _following(kubectl, installed.record.kubeconfig, name, len(load))
            )
            for name in names
        }
        watching = asyncio.create_task(_terminated_states(api, names, version))
        await api.request("DELETE", name_path)
        async with asyncio.timeout(300):
            states = await watching
            logs = {name: await task for name, task in follows.items()}
    unload = [{"argv": ["-rv", "-d", DIR_NAME, entry], "modprobe.d": SOFTDEP} for entry in ORDER]
    for name in names:
        assert _modprobe_calls(logs[name]) == load + unload
        # The main process left on the kubelet's SIGTERM, after preStop:
        # exit 0, not SIGKILL (137) at the end of the grace period.
        assert (states[name]["exitCode"], states[name]["reason"]) == (0, "Completed")

    async def unlabelled() -> bool:
        nodes = (await api.request("GET", resources.NODES.path()))["items"]
        return not any(ready_label in node["metadata"]["labels"] for node in nodes)

    # Unloaded everywhere: the operator takes the .ready label away.
    await _until(unlabelled)
    # Nothing it did was refused: the chart's RBAC covers it.
    for pod in await _operator_pods(api):
        log = await api.request(
            "GET",
            resources.PODS.path(namespace=RELEASE_NAMESPACE, name=pod["metadata"]["name"]) + "/log",
        )
        assert "forbidden" not in str(log).lower(), log


async def _kubeconfig_secret(api: kube_client.Client, pki: Path) -> None:
    """The sandbox admin's kubeconfig as a pod uses it: everything inline
    (CA, client certificate and key) and the ``kubernetes`` Service's address
    (in the API server's certificate)."""
    service = await api.request("GET", SERVICES.path(namespace="default", name="kubernetes"))
    (port,) = service["spec"]["ports"]

    def inline(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandbox",
                "cluster": {
                    "server": f"https://{service['spec']['clusterIP']}:{port['port']}",
                    "certificate-authority-data": inline("ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": inline("admin.crt"),
                    "client-key-data": inline("admin.key"),
                },
            }
        ],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "admin"}}],
        "current-context": "sandbox",
    }
    await api.request(
        "POST",
        SECRETS.path(namespace=RELEASE_NAMESPACE),
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "admin-kubeconfig"},
            "stringData": {"config": json.dumps(config)},
        },
    )


# -- every command of the image -------------------------------------------------


def _commands() -> list[str]:
    group = typer.main.get_command(cli.build())
    assert hasattr(group, "commands")
    return sorted(group.commands)


# The chart's container settings: non-root, read-only root filesystem.
SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


async def _ran(
    api: kube_client.Client, name: str, image: str, argvs: dict[str, dict[str, Any]], **spec: Any
) -> dict[str, tuple[int, str]]:
    """A pod of the release namespace (``restricted``) with one container per
    entry of ``argvs``, run to its end: each container's exit code and log."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": RELEASE_NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": container, "image": image, **argv, "securityContext": SECURITY}
                for container, argv in argvs.items()
            ],
            "imagePullSecrets": [{"name": PULL_SECRET}],
            **spec,
        },
    }
    path = resources.PODS.path(namespace=RELEASE_NAMESPACE, name=name)
    await api.request("POST", resources.PODS.path(namespace=RELEASE_NAMESPACE), body=body)
    try:

        async def finished() -> dict[str, Any] | None:
            pod = await api.request("GET", path)
            phase = (pod.get("status") or {}).get("phase")
            return dict(pod) if phase in ("Succeeded", "Failed") else None

        pod = await _until(finished)
        exits = {
            status["name"]: int(status["state"]["terminated"]["exitCode"])
            for status in pod["status"]["containerStatuses"]
        }
        return {
            container: (
                exits[container],
                str(await api.request("GET", path + "/log", query={"container": container})),
            )
            for container in argvs
        }
    finally:
        await api.request("DELETE", path)


async def test_every_command_the_image_ships_starts_in_a_container(
    api: kube_client.Client, installed: Installed
) -> None:
    argvs: dict[str, dict[str, Any]] = {
        "kmm": {"args": ["--help"]},
        "kubectl-kmm": {"command": ["kubectl-kmm"], "args": ["--help"]},
        **{f"kmm-{name}": {"args": [name, "--help"]} for name in _commands()},
    }
    ran = await _ran(api, "kmm-commands", installed.kmm_image, argvs)
    assert {container: code for container, (code, _log) in ran.items()} == dict.fromkeys(
        argvs, 0
    ), ran
    logs = {container: log for container, (_code, log) in ran.items()}
    assert "Usage: kmm [OPTIONS] COMMAND [ARGS]..." in logs["kmm"]
    assert "Usage: kubectl kmm [OPTIONS] COMMAND [ARGS]..." in logs["kubectl-kmm"]
    for command in _commands():
        # kmm lists it, and it starts.
        assert f" {command} " in logs["kmm"], command
        assert f"Usage: kmm {command} " in logs[f"kmm-{command}"], logs[f"kmm-{command}"]


async def test_the_metrics_service_reaches_the_operators_metrics(
    api: kube_client.Client, installed: Installed
) -> None:
    await _available(api)
    service = await api.request(
        "GET", SERVICES.path(namespace=RELEASE_NAMESPACE, name="kmm-operator-metrics")
    )
    (port,) = service["spec"]["ports"]
    url = f"http://{service['spec']['clusterIP']}:{port['port']}/metrics"
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    ran = await _ran(
        api, "kmm-metrics", installed.kmm_image, {"fetch": {"command": ["python3", "-c", fetch]}}
    )
    code, log = ran["fetch"]
    assert code == 0, log
    # One replica answered through kube-proxy's rules for the ClusterIP.
    assert "\nkmm_leader " in log, log


# -- the operator's shutdown, last: it replaces a pod ----------------------------


async def test_a_deleted_operator_pod_exits_0_and_hands_the_lease_over(
    api: kube_client.Client,
) -> None:
    pods = await _available(api)
    lease_path = resources.LEASES.path(namespace=RELEASE_NAMESPACE, name="kmm-operator")
    leader = (await api.request("GET", lease_path))["spec"]["holderIdentity"]
    assert leader in {pod["metadata"]["name"] for pod in pods}
    listing = await api.request("GET", resources.PODS.path(namespace=RELEASE_NAMESPACE))
    version = listing["metadata"]["resourceVersion"]
    await api.request("DELETE", resources.PODS.path(namespace=RELEASE_NAMESPACE, name=leader))
    terminated: dict[str, Any] = {}
    async with asyncio.timeout(300):
        async for event in api.watch(
            resources.PODS.path(namespace=RELEASE_NAMESPACE),
            query={"resourceVersion": version, "fieldSelector": f"metadata.name={leader}"},
        ):
            obj = event["object"]
            for status in (obj.get("status") or {}).get("containerStatuses") or ():
                terminated = (status.get("state") or {}).get("terminated") or terminated
            if event["type"] == "DELETED":
                break
    # SIGTERM ends the operator (it releases the lease on the way out).
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")

    async def new_holder() -> str | None:
        lease = await api.request("GET", lease_path)
        holder = (lease.get("spec") or {}).get("holderIdentity")
        return str(holder) if holder and holder != leader else None

    assert await _until(new_holder) != leader
