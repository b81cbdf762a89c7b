"""The emulated kubelet's Node: registered like ``registerNode``, kept Ready by heartbeats.

``register`` creates the Node when it does not exist (the usual
``kubernetes.io/hostname``, ``kubernetes.io/os`` and ``kubernetes.io/arch``
labels, a kernel version one may set, capacity and allocatable for pods) and
leaves an existing one's spec alone. ``Heartbeat`` renews the node's Lease in
``kube-node-lease`` every ``interval`` (the kubelet's 10 s with a 40 s
duration) and patches the Ready condition and the kubelet's version and
kernel into the status at a slower pace, as the kubelet's status loop does.
KWOK manages only nodes carrying its annotation, so it leaves these alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import platform
from typing import Any, Final

from kmm.kube import client, errors, resources

__all__ = ["KUBELET_VERSION", "Heartbeat", "NodeSpec", "node_body", "node_status", "register"]

_log = logging.getLogger(__name__)

# The kubelet release whose behaviour the emulator follows (its DRA manager,
# plugin watcher and probes), as the Node reports it.
KUBELET_VERSION: Final = "v1.37.2-kmm-emulator"
LEASE_NAMESPACE: Final = "kube-node-lease"
LEASE_SECONDS: Final = 40


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    name: str
    kernel: str = dataclasses.field(default_factory=platform.release)
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"
    address: str = "127.0.0.1"
    # More labels for a Node it creates (the kubelet's --node-labels).
    labels: tuple[tuple[str, str], ...] = ()
    # node.status.declaredFeatures (NodeDeclaredFeatures, GA in 1.37): the
    # gated features the kubelet has on, which the scheduler may require.
    declared_features: tuple[str, ...] = ()


def _conditions(ready: bool) -> list[dict[str, Any]]:
    now = _now()
    found = [
        {
            "type": kind,
            "status": "False",
            "reason": reason,
            "message": "kmm kubelet emulator",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind, reason in (
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        )
    ]
    found.append(
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kmm kubelet emulator is posting ready status",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    )
    return found


def node_status(spec: NodeSpec) -> dict[str, Any]:
    """The status the kubelet sets at registration (``setNodeStatus``)."""
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    status: dict[str, Any] = {
        "capacity": capacity,
        "allocatable": dict(capacity),
        "conditions": _conditions(True),
        "addresses": [
            {"type": "InternalIP", "address": spec.address},
            {"type": "Hostname", "address": spec.name},
        ],
        "nodeInfo": {
            "kernelVersion": spec.kernel,
            "kubeletVersion": KUBELET_VERSION,
            "containerRuntimeVersion": "kmm-emulator://0",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "osImage": "kmm kubelet emulator",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kubeProxyVersion": "",
        },
    }
    if spec.declared_features:  # omitempty
        status["declaredFeatures"] = sorted(spec.declared_features)
    return status


def node_body(spec: NodeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kmm.sigs.x-k8s.io/emulated": "true",
                **dict(spec.labels),
            },
        },
        "spec": {},
    }


async def register(api: client.Client, spec: NodeSpec) -> dict[str, Any]:
    """The Node, created if it does not exist; its status set Ready either way."""
    try:
        found: dict[str, Any] = await api.request("GET", resources.NODES.path(name=spec.name))
    except errors.NotFound:
        try:
            found = await api.request("POST", resources.NODES.path(), body=node_body(spec))
            _log.info("registered node %s", spec.name)
        except errors.Conflict:
            found = await api.request("GET", resources.NODES.path(name=spec.name))
    await api.request(
        "PATCH",
        resources.NODES.path(name=spec.name, subresource="status"),
        body={"status": node_status(spec)},
        content_type=client.MERGE_PATCH,
    )
    return found


class Heartbeat:
    """Renews the node Lease every ``interval``; the status every ``status_every`` renewals."""

    def __init__(
        self,
        api: client.Client,
        spec: NodeSpec,
        node_uid: str,
        *,
        interval: float = 10.0,
        status_every: int = 6,
    ) -> None:
        self.api, self.spec, self.node_uid = api, spec, node_uid
        self.interval, self.status_every = interval, status_every
        self.beats = 0

    def _lease(self) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.spec.name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.spec.name,
                        "uid": self.node_uid,
                    }
                ],
            },
            "spec": {
                "holderIdentity": self.spec.name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _micro_now(),
            },
        }

    async def beat(self) -> None:
        lease = self._lease()
        try:
            await self.api.request(
                "PATCH",
                resources.LEASES.path(LEASE_NAMESPACE, self.spec.name),
                query={"fieldManager": "kmm-kubelet", "force": True},
                body=lease,
                content_type=client.APPLY_PATCH,
            )
        except errors.ApiError as err:
            _log.warning("node lease not renewed: %s", err)
        if self.beats % self.status_every == 0:
            try:
                await self.api.request(
                    "PATCH",
                    resources.NODES.path(name=self.spec.name, subresource="status"),
                    body={"status": {"conditions": _conditions(True)}},
                    content_type=client.MERGE_PATCH,
                )
            except errors.ApiError as err:
                _log.warning("node status not updated: %s", err)
        self.beats += 1

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.interval)
