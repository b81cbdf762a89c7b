"""``kmm status`` and ``kmm upgrade`` name a pod held back by its init container;
``kmm status`` and ``kmm modules`` show each kernel's image as ``status.images`` says.

The sandbox cannot make an image pull fail: KWOK runs every pod on its nodes
(its pod-running stage rewrites a Pending pod's status as soon as it sees
one) and the kubelet nodes' fake runtime pulls any image. So the test plays
the kubelet of a node of its own, one that no KWOK manages (it lacks the
``kwok.x-k8s.io/node`` annotation): a device-plugin pod is bound to it and
its status is written through the pods/status subresource, as a kubelet
writes it when an init container's image does not pull. Everything else
(the Module, the node, the pod, both commands and their watches) is the
real API server's. ``status.images`` is written the same way, through the
Module's status subresource, as the operator writes it: what is tested is
that the commands read it back from a real API server (the CRD's schema
keeps it), not how the operator arrives at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.kube import client as kube_client
from kmm.kube import errors, resources
from kmm.sandbox import testing

manifests = support.manifests

KMM = Path(sys.executable).with_name("kmm")
NAME = "stuck"
IMAGE = "example.com/plugin-init:v1"
PULL_MESSAGE = f'Back-off pulling image "{IMAGE}"'
NOW = "2026-12-02T04:00:00Z"
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)


def module(select: str) -> dict[str, Any]:
    body = support.module_body(
        NAME,
        {select: "yes"},
        devicePlugin={
            "container": {"image": "example.com/plugin:v1"},
            "initContainer": {"image": IMAGE},
        },
    )
    body["spec"]["moduleLoader"]["container"]["version"] = "v1"
    return body


def plugin_pod(namespace: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "stuck-device-plugin-x7k2p",
            "labels": {
                labels.MODULE_NAME: NAME,
                labels.MODULE_NAMESPACE: namespace,
                labels.ROLE: "device-plugin",
            },
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [{"name": "device-plugin-init", "image": IMAGE}],
            "containers": [{"name": "device-plugin", "image": "example.com/plugin:v1"}],
        },
    }


def image_pull_backoff() -> dict[str, Any]:
    """The status a kubelet posts for a pod whose init container's image does not pull."""

    def condition(type_: str, status: str, reason: str | None = None) -> dict[str, Any]:
        found = {"type": type_, "status": status, "lastTransitionTime": NOW}
        return found | ({"reason": reason} if reason else {})

    return {
        "status": {
            "phase": "Pending",
            "conditions": [
                condition("PodReadyToStartContainers", "True"),
                condition("Initialized", "False", "ContainersNotInitialized"),
                condition("Ready", "False", "ContainersNotReady"),
                condition("ContainersReady", "False", "ContainersNotReady"),
                condition("PodScheduled", "True"),
            ],
            "startTime": NOW,
            "initContainerStatuses": [
                {
                    "name": "device-plugin-init",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": PULL_MESSAGE}},
                    "lastState": {},
                }
            ],
            "containerStatuses": [
                {
                    "name": "device-plugin",
                    "image": "example.com/plugin:v1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": "PodInitializing"}},
                    "lastState": {},
                }
            ],
            "qosClass": "BestEffort",
        }
    }


@contextlib.asynccontextmanager
async def module_in(api: client.ApiClient, namespace: str, select: str) -> AsyncIterator[None]:
    """The Module, gone again before the test ends: no operator runs here to
    finalize it, and one a later test's operator found in a namespace still
    terminating would keep that test's finalizer forever."""
    await support.create_module(api, namespace, module(select))
    objects = client.CustomObjectsApi(api)
    try:
        yield
    finally:
        await objects.delete_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, NAME
        )

        async def gone() -> bool:
            try:
                await objects.get_namespaced_custom_object(
                    modules.GROUP, modules.VERSION, namespace, modules.PLURAL, NAME
                )
            except client.ApiException as err:
                return err.status == 404
            return False

        await testing.eventually(gone, "the test's Module deleted")


@contextlib.asynccontextmanager
async def node_without_kwok(api: kube_client.Client, select: str) -> AsyncIterator[str]:
    """A Node no KWOK manages (nothing but the test writes its pods' statuses)."""
    name = f"kmm-nokubelet-{uuid.uuid4().hex[:6]}"
    await api.request(
        "POST",
        resources.NODES.path(),
        body={
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {select: "yes"}},
        },
    )
    try:
        await api.request(
            "PATCH",
            resources.NODES.path(name=name, subresource="status"),
            body={"status": {"nodeInfo": {"kernelVersion": "6.8.0-45-generic"}}},
            content_type=kube_client.MERGE_PATCH,
        )
        yield name
    finally:
        with contextlib.suppress(errors.NotFound):
            await api.request("DELETE", resources.NODES.path(name=name))


@contextlib.asynccontextmanager
async def pod_on(api: kube_client.Client, namespace: str, node: str) -> AsyncIterator[str]:
    pod = plugin_pod(namespace, node)
    await api.request("POST", resources.PODS.path(namespace), body=pod)
    name: str = pod["metadata"]["name"]
    try:
        yield name
    finally:
        # No kubelet will finish a graceful delete on this node.
        with contextlib.suppress(errors.NotFound):
            await api.request(
                "DELETE", resources.PODS.path(namespace, name), query={"gracePeriodSeconds": 0}
            )


async def stick(api: kube_client.Client, namespace: str, pod: str) -> None:
    await api.request(
        "PATCH",
        resources.PODS.path(namespace, pod, subresource="status"),
        body=image_pull_backoff(),
        content_type=kube_client.MERGE_PATCH,
    )


def flat(text: str) -> str:
    """``text`` without table borders or whitespace (a long cell wraps)."""
    return "".join(text.replace("│", "").split())


async def test_kmm_status_names_an_init_container_whose_image_does_not_pull(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    select = f"kmm-stuck-{uuid.uuid4().hex[:6]}"
    async with (
        module_in(api_client, namespace, select),
        node_without_kwok(kmm_api, select) as node,
        pod_on(kmm_api, namespace, node) as pod,
    ):
        await stick(kmm_api, namespace, pod)
        status = await asyncio.create_subprocess_exec(
            str(KMM), "status", f"--kubeconfig={sandbox.kubeconfig}", f"{namespace}/{NAME}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await status.communicate()
        assert status.returncode == 0, err.decode()
        assert flat(node) in flat(out.decode())
        expected = (
            f"pod {pod}: init container device-plugin-init: ImagePullBackOff ({PULL_MESSAGE})"
        )
        assert flat(expected) in flat(out.decode()), out.decode()


async def test_kmm_upgrade_stops_on_an_init_container_that_gets_stuck_while_it_waits(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    """The pod gets stuck after ``kmm upgrade`` has printed the node's step:
    the step stays the same and the problem is new. No operator runs, so
    nothing else would end the wait before ``--timeout``."""
    select = f"kmm-stuck-{uuid.uuid4().hex[:6]}"
    async with (
        module_in(api_client, namespace, select),
        node_without_kwok(kmm_api, select) as node,
        pod_on(kmm_api, namespace, node) as pod,
    ):
        upgrade = await asyncio.create_subprocess_exec(
            str(KMM), "upgrade", f"--kubeconfig={sandbox.kubeconfig}", f"{namespace}/{NAME}",
            node, "--to", "v1", "--timeout", "120",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert upgrade.stdout is not None
        step = f"{node}: adding the module-loader version label v1"
        printed = []
        while not printed or printed[-1] != step:
            line = await upgrade.stdout.readline()
            assert line, f"kmm upgrade ended before printing {step!r}: {printed}"
            printed.append(line.decode().strip())
        await stick(kmm_api, namespace, pod)
        out, err = await upgrade.communicate()
        error = " ".join(err.decode().split())
        assert upgrade.returncode == 1, (printed, out.decode(), error)
        assert "did not reach" not in error, error
        assert (
            f"{node} is stuck at: adding the module-loader version label v1; pod {pod}: "
            f"init container device-plugin-init: ImagePullBackOff ({PULL_MESSAGE})"
        ) in error, error


async def test_kmm_status_and_modules_show_each_kernels_image_from_the_modules_status(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    select = f"kmm-stuck-{uuid.uuid4().hex[:6]}"
    build_pod = f"{NAME}-build-6-8-0-45-generic"
    async with (
        module_in(api_client, namespace, select),
        node_without_kwok(kmm_api, select) as node,
    ):
        images = [
            {
                "kernel": "6.8.0-45-generic",
                "image": f"10.253.0.1:5000/{namespace}/{NAME}:6.8.0-45-generic",
                "state": "BuildFailed",
                "pod": build_pod,
                "message": "STEP 4/7: RUN make: exit status 2",
            },
            {"kernel": "5.14.0-1", "image": f"r/{NAME}:5.14.0-1", "state": "Exists"},
        ]
        await kmm_api.request(
            "PATCH",
            _MODULES.path(namespace, NAME, subresource="status"),
            body={"status": {"images": images}},
            content_type=kube_client.MERGE_PATCH,
        )
        outputs = []
        for command in (["status", f"{namespace}/{NAME}"], ["modules", "-n", namespace]):
            run = await asyncio.create_subprocess_exec(
                str(KMM), *command, f"--kubeconfig={sandbox.kubeconfig}",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "250"},
            )  # fmt: skip
            out, err = await run.communicate()
            assert run.returncode == 0, err.decode()
            outputs.append(out.decode())
        status, listed = outputs
        # The node's kernel's image, its pod and why; not the other kernel's.
        # (One row: node, kernel, image cell, in this order.)
        expected = f"{node} 6.8.0-45-generic build failed (pod {build_pod}): STEP 4/7: RUN make"
        assert flat(expected) in flat(status), status
        assert "exists" not in status, status
        # Every kernel's image, with its pod.
        assert flat(f"6.8.0-45-generic: build failed (pod {build_pod})") in flat(listed), listed
        assert flat("5.14.0-1: exists") in flat(listed), listed
