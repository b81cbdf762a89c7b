"""Fake nodes: created through the API, kept Ready by KWOK.

A fake node carries the annotation KWOK selects on, the usual well-known labels,
and a ``status.nodeInfo.kernelVersion`` of our choosing (the API server keeps a
node's status on create, as it must for the kubelet's own registration). It has
no taints, so scheduling tests decide taints themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client

__all__ = ["FAKE_NODE_ANNOTATION", "create", "node_body", "spread", "wait_ready"]

FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


def node_body(name: str, kernel: str) -> client.V1Node:
    return client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(
            name=name,
            labels={
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
            annotations={FAKE_NODE_ANNOTATION[0]: FAKE_NODE_ANNOTATION[1]},
        ),
        status=client.V1NodeStatus(
            node_info=client.V1NodeSystemInfo(
                kernel_version=kernel,
                architecture="amd64",
                operating_system="linux",
                os_image="kmm sandbox",
                container_runtime_version="kwok",
                kubelet_version="kwok",
                kube_proxy_version="kwok",
                machine_id="",
                system_uuid="",
                boot_id="",
            )
        ),
    )


def spread(
    count: int, kernels: Sequence[str], *, prefix: str = "kmm-worker"
) -> list[tuple[str, str]]:
    """(name, kernel) for ``count`` nodes, kernels assigned round robin."""
    return [(f"{prefix}-{index}", kernels[index % len(kernels)]) for index in range(count)]


async def create(api: client.ApiClient, nodes: Sequence[tuple[str, str]]) -> None:
    core = client.CoreV1Api(api)
    await asyncio.gather(*(core.create_node(node_body(name, kernel)) for name, kernel in nodes))


def _is_schedulable_ready(node: Any) -> bool:
    conditions = node.status.conditions or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    # The node lifecycle controller taints a new node not-ready until it sees
    # Ready; waiting for the taint to go makes the sandbox usable at once.
    taints = node.spec.taints or []
    return ready and not any(t.key.startswith("node.kubernetes.io/") for t in taints)


async def wait_ready(api: client.ApiClient, names: Sequence[str], *, timeout: float) -> None:
    """Return when every named node is Ready and untainted; TimeoutError otherwise."""
    core = client.CoreV1Api(api)
    wanted = set(names)

    async def poll() -> None:
        while True:
            listing = await core.list_node(label_selector="type=kwok")
            ready = {node.metadata.name for node in listing.items if _is_schedulable_ready(node)}
            if wanted <= ready:
                return
            await asyncio.sleep(0.25)

    await asyncio.wait_for(poll(), timeout)
