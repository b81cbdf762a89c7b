"""A registry that wants credentials, pulled from by real containerd nodes.

One sandbox for the module: one container node, the registry with htpasswd
(``--registry-auth``). ``kmm sandbox push`` authenticates itself; a pod
without ``imagePullSecrets`` is refused by the registry (containerd's pull
answers 401: "no basic auth credentials"), one with them runs; and a Module's ``imageRepoSecret`` reaches
its loader pods, whose image is pulled with it and whose ``modprobe`` runs.
The operator runs in the test process; the pods run in containers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
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
from kmm.sandbox import cluster, registry

_USER, _PASSWORD = "puller", "s3cret:pass"
_SECRETS = resources.Resource("", "v1", "secrets")
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
_KMM = Path(sys.executable).with_name("kmm")
_LOADER = Path("build/images/loader.tar")
NAMESPACE = "default"


@pytest.fixture(scope="module")
def locked() -> Iterator[tuple[cluster.state.SandboxState, str]]:
    """The sandbox and the loader image's reference, pushed with credentials."""
    auth = registry.Auth(_USER, _PASSWORD)
    with containersandbox.started("ka", kubelet_nodes=1, registry_auth=auth) as record:
        # kmm sandbox push authenticates itself with the sandbox's credentials.
        pushed = containersandbox.push(record.directory, _LOADER, "authed/loader:1")
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield record, pushed


@pytest.fixture
async def api(
    locked: tuple[cluster.state.SandboxState, str],
) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(locked[0].kubeconfig) as found:
        yield found


def _pull_secret(record: cluster.state.SandboxState, name: str) -> dict[str, Any]:
    # The dockerconfigjson the sandbox wrote for its registry (both addresses).
    assert record.registry is not None
    assert record.registry.credentials is not None
    config = Path(record.registry.credentials).read_bytes()
    assert record.registry.reference_host in json.loads(config)["auths"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


@contextlib.asynccontextmanager
async def _created(api: kube_client.Client, resource: Any, body: dict[str, Any]) -> AsyncIterator[None]:  # fmt: skip
    name = body["metadata"]["name"]
    await api.request("POST", resource.path(namespace=NAMESPACE), body=body)
    try:
        yield
    finally:
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resource.path(namespace=NAMESPACE, name=name))


def _pod(name: str, node: str, image: str, secret: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": image, "command": ["sleep", "3600"]}],
    }
    if secret is not None:
        spec["imagePullSecrets"] = [{"name": secret}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def _state(api: kube_client.Client, name: str) -> tuple[str, dict[str, Any]]:
    pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=name))
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return (pod.get("status") or {}).get("phase", ""), statuses[0].get("state") or {}


async def test_a_pod_pulls_only_with_the_registrys_credentials(
    locked: tuple[cluster.state.SandboxState, str], api: kube_client.Client
) -> None:
    record, image = locked
    node = record.kubelet_nodes[0]
    secret = f"pull-{uuid.uuid4().hex[:6]}"
    without, with_ = f"anon-{uuid.uuid4().hex[:6]}", f"authed-{uuid.uuid4().hex[:6]}"
    async with (
        _created(api, _SECRETS, _pull_secret(record, secret)),
        _created(api, resources.PODS, _pod(without, node, image, None)),
        _created(api, resources.PODS, _pod(with_, node, image, secret)),
    ):
        refused = ""
        async with asyncio.timeout(120):
            while True:
                _, state = await _state(api, without)
                waiting = state.get("waiting") or {}
                if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                    refused = waiting.get("message", "")
                    if refused:
                        break
                await asyncio.sleep(0.3)
        # containerd's words for the registry's 401 to an anonymous pull.
        assert "no basic auth credentials" in refused, refused
        async with asyncio.timeout(120):
            while True:
                if (await _state(api, with_))[0] == "Running":
                    break
                await asyncio.sleep(0.3)
        # The anonymous one never got the image meanwhile.
        assert "running" not in (await _state(api, without))[1]


def _loader_module(name: str, node: str, kernel: str, image: str, secret: str) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"kubernetes.io/hostname": node},
            "imageRepoSecret": {"name": secret},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmm_authed"},
                    "kernelMappings": [{"literal": kernel, "containerImage": image}],
                }
            },
        },
    }


async def test_a_modules_image_repo_secret_pulls_its_loader_image(
    locked: tuple[cluster.state.SandboxState, str], api: kube_client.Client
) -> None:
    record, image = locked
    node_name = record.kubelet_nodes[0]
    node = await api.request("GET", resources.NODES.path(name=node_name))
    kernel = node["status"]["nodeInfo"]["kernelVersion"]
    secret, name = f"repo-{uuid.uuid4().hex[:6]}", f"authed-{uuid.uuid4().hex[:6]}"
    ready = labels.ready(NAMESPACE, name)
    async with (
        _created(api, _SECRETS, _pull_secret(record, secret)),
        support.operator_in_process(record.kubeconfig),
    ):
        path = _MODULES.path(namespace=NAMESPACE)
        await api.request("POST", path, body=_loader_module(name, node_name, kernel, image, secret))
        try:
            async with asyncio.timeout(180):
                while True:
                    found = await api.request("GET", resources.NODES.path(name=node_name))
                    if ready in found["metadata"].get("labels", {}):
                        break
                    await asyncio.sleep(0.5)
            pods = await api.request(
                "GET",
                resources.PODS.path(namespace=NAMESPACE),
                query={"labelSelector": f"{labels.MODULE_NAME}={name}"},
            )
            (loader,) = pods["items"]
            assert loader["spec"]["imagePullSecrets"] == [{"name": secret}]
            assert loader["spec"]["containers"][0]["image"] == image
            log = await api.request(
                "GET",
                resources.PODS.path(namespace=NAMESPACE, name=loader["metadata"]["name"]) + "/log",
            )
            # The image's modprobe ran in the container the credentials pulled.
            assert "KMM-MODPROBE" in log, log
            assert "kmm_authed" in log, log
        finally:
            await api.request("DELETE", _MODULES.path(namespace=NAMESPACE, name=name))
            async with asyncio.timeout(180):
                with contextlib.suppress(kube_errors.NotFound):
                    while True:
                        await api.request("GET", _MODULES.path(namespace=NAMESPACE, name=name))
                        await asyncio.sleep(0.5)
