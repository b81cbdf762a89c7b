"""Container nodes: pods in real containers (containerd, runc, CNI, kube-proxy).

One sandbox for the module: two container nodes and one KWOK node. The test
images come from ``make test-images`` (build/images/*.tar): the workload is
pushed to the sandbox registry with ``kmm sandbox push`` and pulled
by each node's containerd from 10.253.0.1:5000 (the relay in the fabric,
TLS from the sandbox CA). Everything a pod says is read as a user reads it:
its log through the API server (``pods/log``, which the API server fetches
from the kubelet through the relay's CONNECT proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import pytest
import test_operator_support as support

from kmm.api import labels, modules
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.sandbox import addressing, cluster, restarting, testing
from kmm.sandbox.containernodes import nodes as containernodes

IMAGES = Path("build/images")
# What the fixture pushes and pods pull; set once the registry answered.
WORKLOAD = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}/workload:1"
NAMESPACE = "default"
NODES = [f"kmm-kubelet-{i}" for i in range(2)]
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)


@pytest.fixture(scope="module")
def containers() -> Iterator[cluster.state.SandboxState]:
    with containersandbox.started("kc", nodes=1, kubelet_nodes=2) as record:
        # As a user pushes: the command, whose last line is the reference.
        pushed = containersandbox.push(record.directory, IMAGES / "workload.tar", "workload:1")
        assert pushed == WORKLOAD
        yield record


@pytest.fixture
async def api(containers: cluster.state.SandboxState) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(containers.kubeconfig) as found:
        yield found


def _pod(
    name: str, node: str, script: str, *, image: str = WORKLOAD, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script + "; echo KMM-TEST done; exec sleep 3600"],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            **spec,
        },
    }


@contextlib.asynccontextmanager
async def running(api: kube_client.Client, body: dict[str, Any]) -> AsyncIterator[str]:
    """Create the pod and yield its log once the script printed ``done``."""
    name = body["metadata"]["name"]
    await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=body)
    try:
        yield await _log_when_done(api, name)
    finally:
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resources.PODS.path(namespace=NAMESPACE, name=name))


async def _log_when_done(api: kube_client.Client, name: str, *, timeout: float = 120) -> str:
    path = resources.PODS.path(namespace=NAMESPACE, name=name) + "/log"
    async with asyncio.timeout(timeout):
        while True:
            pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=name))
            if (pod.get("status") or {}).get("phase") == "Running":
                text = await api.request("GET", path)
                if "KMM-TEST done" in (text or ""):
                    return str(text)
            await asyncio.sleep(0.3)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_a_pod_runs_and_its_log_is_read_through_the_api_server(
    api: kube_client.Client,
) -> None:
    for node in NODES:
        async with running(
            api, _pod(_name("hello"), node, "echo KMM-TEST hello $(hostname)")
        ) as log:
            assert "KMM-TEST hello" in log
            # The image's own entrypoint is not run: the command is ours.
            assert "KMM-WORKLOAD" not in log


async def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    api: kube_client.Client,
) -> None:
    # busybox's wget cannot agree on a TLS cipher with the API server, so it
    # speaks plain HTTP to the TLS port: the API server's answer ("400 Bad
    # Request", Go's reply to HTTP on a TLS port) proves the ClusterIP was
    # translated by kube-proxy and relayed to the API server on the host.
    script = "wget -O - http://10.96.0.1:443/version 2>&1"
    async with running(api, _pod(_name("svc"), NODES[1], script)) as log:
        assert "wget: server returned error: HTTP/1.0 400 Bad Request" in log


async def test_a_pod_reaches_the_registry_at_the_reference_it_pulls_by(
    api: kube_client.Client, containers: cluster.state.SandboxState
) -> None:
    # Where a build pod will push: the reference's host, from a pod's own
    # network namespace (routed by its node across the fabric to the relay).
    # Plain HTTP to the TLS port, as above: the registry's Go TLS server
    # answers 400, which only the registry behind the relay can have said.
    assert containers.registry is not None
    host = containers.registry.reference_host
    script = f"wget -O - http://{host}/v2/ 2>&1"
    async with running(api, _pod(_name("reg"), NODES[0], script)) as log:
        assert "wget: server returned error: HTTP/1.0 400 Bad Request" in log


async def test_a_hostpath_under_var_lib_kubelet_is_the_nodes_directory(
    api: kube_client.Client, containers: cluster.state.SandboxState
) -> None:
    node = containernodes.load(containers.directory / "kubelets" / "0")
    assert node is not None
    plugins = node.kubelet.kubelet_dir / "plugins"
    marker = f"marker-{uuid.uuid4().hex[:6]}"
    (plugins / marker).write_text("from the node's directory\n")
    written = f"written-{uuid.uuid4().hex[:6]}"
    body = _pod(
        _name("hostpath"),
        node.name,
        f"ls /plugins | sed 's/^/KMM-TEST seen /'; echo hello > /plugins/{written}",
        volumes=[{"name": "p", "hostPath": {"path": "/var/lib/kubelet/plugins"}}],
        # Root, as a driver writing the node's plugins directory is.
        container={
            "volumeMounts": [{"name": "p", "mountPath": "/plugins"}],
            "securityContext": {"runAsUser": 0},
        },
    )
    async with running(api, body) as log:
        assert f"KMM-TEST seen {marker}" in log
        assert (plugins / written).read_text() == "hello\n"
        assert not Path("/var/lib/kubelet/plugins", written).exists()


async def test_a_pod_with_the_runtime_default_seccomp_profile_runs_filtered(
    api: kube_client.Client,
) -> None:
    body = _pod(
        _name("seccomp"),
        NODES[0],
        "grep Seccomp: /proc/self/status | sed 's/^/KMM-TEST /'",
        securityContext={"seccompProfile": {"type": "RuntimeDefault"}},
    )
    async with running(api, body) as log:
        # 2: a seccomp filter applies (runc built with libseccomp).
        assert "KMM-TEST Seccomp:\t2" in log


async def test_an_image_from_outside_fails_at_once_without_dialling_out(
    api: kube_client.Client,
) -> None:
    name = _name("outside")
    body = _pod(name, NODES[0], "true", image="docker.io/library/busybox:1.36")
    await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=body)
    try:
        async with asyncio.timeout(120):
            while True:
                pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=name))
                statuses = (pod.get("status") or {}).get("containerStatuses") or ()
                waiting = statuses[0].get("state", {}).get("waiting", {}) if statuses else {}
                if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                    break
                await asyncio.sleep(0.3)
        # containerd asked the _default hosts.toml's closed loopback port,
        # never docker.io.
        assert "https://127.0.0.1:1/v2/library/busybox" in waiting.get("message", "") or (
            waiting.get("reason") == "ImagePullBackOff"
        )
        events = await api.request(
            "GET",
            resources.EVENTS.path(namespace=NAMESPACE),
            query={"fieldSelector": f"involvedObject.name={name}"},
        )
        messages = " ".join(e.get("message", "") for e in events["items"])
        assert "dial tcp 127.0.0.1:1: connect: connection refused" in messages
    finally:
        await api.request("DELETE", resources.PODS.path(namespace=NAMESPACE, name=name))


async def test_kwok_nodes_are_tainted_and_container_nodes_are_not(
    api: kube_client.Client, containers: cluster.state.SandboxState
) -> None:
    listing = await api.request("GET", resources.NODES.path())
    taints = {
        item["metadata"]["name"]: (item.get("spec") or {}).get("taints") or []
        for item in listing["items"]
    }
    for name in containers.node_names:
        assert cluster.KWOK_TAINT in taints[name]
    for name in NODES:
        assert cluster.KWOK_TAINT not in taints[name]


def _kwok_module(name: str, node: str, *, tolerate: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"kubernetes.io/hostname": node},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "kmm_kwok"},
                "kernelMappings": [{"regexp": ".*", "containerImage": WORKLOAD}],
            }
        },
    }
    if tolerate:
        spec["tolerations"] = [
            {"key": cluster.KWOK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


async def test_a_module_meant_for_kwok_nodes_reaches_them_only_by_tolerating_the_taint(
    api: kube_client.Client, containers: cluster.state.SandboxState
) -> None:
    (kwok_node,) = containers.node_names
    await support.install_manifests(containers.kubeconfig)
    collection = _MODULES.path(namespace=NAMESPACE)
    names = {tolerate: _name("kwok-tolerating" if tolerate else "kwok-plain") for tolerate in (True, False)}  # fmt: skip
    async with support.operator_in_process(containers.kubeconfig):
        for tolerate, name in names.items():
            await api.request(
                "POST", collection, body=_kwok_module(name, kwok_node, tolerate=tolerate)
            )
        try:

            async def settled() -> tuple[dict[bool, dict[str, Any]], dict[bool, list[Any]]]:
                statuses, daemonsets = {}, {}
                for tolerate, name in names.items():
                    module = await api.request("GET", _MODULES.path(namespace=NAMESPACE, name=name))
                    statuses[tolerate] = module.get("status") or {}
                    listing = await api.request(
                        "GET",
                        resources.DAEMONSETS.path(namespace=NAMESPACE),
                        query={"labelSelector": f"{labels.MODULE_NAME}={name}"},
                    )
                    daemonsets[tolerate] = [item.get("status") or {} for item in listing["items"]]
                return statuses, daemonsets

            statuses: dict[bool, dict[str, Any]] = {}
            daemonsets: dict[bool, list[Any]] = {}
            try:
                async with asyncio.timeout(180):
                    while True:
                        statuses, daemonsets = await settled()
                        reconciled = all(
                            s.get("observedGeneration") == 1 for s in statuses.values()
                        )
                        ready = [d.get("numberReady") for d in daemonsets[True]] == [1] and (
                            statuses[True].get("moduleLoader", {}).get("availableNumber") == 1
                        )
                        if reconciled and ready:
                            break
                        await asyncio.sleep(0.5)
            except TimeoutError:
                pytest.fail(f"never settled: {statuses} {daemonsets}")
            # Both reconciled: the taint keeps the plain Module off the KWOK
            # node (no loader for it, as KMM leaves out what a Module does not
            # tolerate); the tolerating one's loader runs there, as far as KWOK
            # runs anything.
            assert daemonsets[False] == []
            # The node matches its selector; it is not a target while tainted.
            assert statuses[False]["moduleLoader"] == {
                "nodesMatchingSelectorNumber": 1,
                "desiredNumber": 0,
                "availableNumber": 0,
            }
            node = await api.request("GET", resources.NODES.path(name=kwok_node))
            node_labels = node["metadata"].get("labels") or {}
            assert labels.ready(NAMESPACE, names[True]) in node_labels
            assert labels.ready(NAMESPACE, names[False]) not in node_labels
        finally:
            for name in names.values():
                with contextlib.suppress(kube_errors.NotFound):
                    await api.request("DELETE", _MODULES.path(namespace=NAMESPACE, name=name))
            async with asyncio.timeout(180):
                for name in names.values():
                    with contextlib.suppress(kube_errors.NotFound):
                        while True:
                            await api.request("GET", _MODULES.path(namespace=NAMESPACE, name=name))
                            await asyncio.sleep(0.5)


async def test_a_nodes_restart_restarts_its_services_and_its_containers_keep_running(
    api: kube_client.Client, containers: cluster.state.SandboxState
) -> None:
    # `kmm sandbox restart kmm-kubelet-1`: containerd, the kubelet and
    # kube-proxy restart, as a machine restarts those services; the shims
    # and the containers they run stay.
    node = NODES[1]
    services = [f"{service}/{node}" for service in ("containerd", "kubelet", "kube-proxy")]

    def pids() -> list[int]:
        record = cluster.status(containers.directory)
        return [next(p.pid for p in record.launched if p.name == name) for name in services]

    name = _name("survivor")
    async with running(api, _pod(name, node, "echo KMM-TEST started")):
        pod_path = resources.PODS.path(namespace=NAMESPACE, name=name)
        before = await api.request("GET", pod_path)
        old = pids()
        await restarting.restart_node(containers.directory, node)
        new = pids()
        assert all(a != b for a, b in zip(old, new, strict=True))
        assert all(p.alive() for p in cluster.status(containers.directory).launched)

        async def still_running() -> bool:
            pod = await api.request("GET", pod_path)
            (status,) = pod["status"]["containerStatuses"]
            return bool(status.get("ready")) and status["restartCount"] == 0

        await testing.eventually(still_running, "the pod ran on through the restart", bound=120)
        after = await api.request("GET", pod_path)
        (before_status,) = before["status"]["containerStatuses"]
        (after_status,) = after["status"]["containerStatuses"]
        assert after_status["containerID"] == before_status["containerID"]
