"""Fake nodes: created through the API, kept Ready by KWOK.

A fake node carries the annotation KWOK selects on, the usual well-known labels,
and a ``status.nodeInfo.kernelVersion`` of our choosing (the API server keeps a
node's status on create, as it must for the kubelet's own registration). It has
no taints, so scheduling tests decide taints themselves, but for the one a
sandbox with container nodes gives them all (``create``'s ``taints``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from kmm.kube import client, objects, resources
from kmm.sandbox import nodekinds

__all__ = ["FAKE_NODE_ANNOTATION", "create", "node_body", "spread", "wait_ready"]

FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


def node_body(
    name: str, kernel: str, taints: Sequence[Mapping[str, str]] = ()
) -> objects.RawObject:
    body: objects.RawObject = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
            "annotations": {FAKE_NODE_ANNOTATION[0]: FAKE_NODE_ANNOTATION[1]},
        },
        "status": {
            "nodeInfo": {
                "kernelVersion": kernel,
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "kmm sandbox",
                "containerRuntimeVersion": "kwok",
                "kubeletVersion": "kwok",
                "kubeProxyVersion": "kwok",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            }
        },
    }
    if taints:
        body["spec"] = {"taints": [dict(taint) for taint in taints]}
    return body


def spread(
    count: int, kernels: Sequence[str], *, prefix: str = "kmm-worker"
) -> list[tuple[str, str]]:
    """(name, kernel) for ``count`` nodes, kernels assigned round robin."""
    return [(f"{prefix}-{index}", kernels[index % len(kernels)]) for index in range(count)]


async def create(
    api: client.Client,
    nodes: Sequence[tuple[str, str]],
    *,
    taints: Sequence[Mapping[str, str]] = (),
) -> None:
    path = resources.NODES.path()
    await asyncio.gather(
        *(api.request("POST", path, body=node_body(name, kernel, taints)) for name, kernel in nodes)
    )


async def wait_ready(
    api: client.Client, names: Sequence[str], *, timeout: float, label_selector: str = "type=kwok"
) -> None:
    """Return when every named KWOK node is Ready and untainted; TimeoutError otherwise."""
    await nodekinds.wait_ready(api, names, timeout=timeout, label_selector=label_selector)
