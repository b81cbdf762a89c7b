"""The sandbox's fake-runtime kubelet nodes behind the node interface.

``plan`` lays out node ``i`` in ``<sandbox>/kubelets/<i>/`` with three host
ports (kubelet, healthz, the fake runtime's HTTP side); its namespaces go on
the fabric at index ``i`` (``attachments``: the kubelet's fixed host paths
covered in its mount namespace, its two ports published on the host's
loopback). ``start`` runs, per node, the fake runtime (on the host) then
the kubelet (in the node's namespaces), and returns once every Node is
Ready. ``restart`` restarts a node's kubelet, as a machine restarts its
kubelet service; ``stop`` stops both. The host sysctls the kubelets change
are claimed before the first one starts and released by ``stop``
(``hostsysctls``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path

from kmm.sandbox import (
    addressing,
    health,
    hostsysctls,
    launching,
    networking,
    nodekinds,
    pki,
    state,
)
from kmm.sandbox.kubeletnodes import nodes

__all__ = ["KIND", "KubeletNodes", "identities", "names", "of", "plan"]

KIND = "kubelet"


def names(count: int) -> list[str]:
    """The names of ``count`` kubelet nodes (container nodes share them)."""
    return [f"{nodes.NODE_PREFIX}{index}" for index in range(count)]


def identities(planned: Sequence[str]) -> list[pki.ClientIdentity]:
    """The client identities these nodes' kubelets authenticate with."""
    return [nodes.identity(name) for name in planned]


def _directory(record: state.SandboxState, index: int) -> Path:
    # Short: unix socket paths under it are limited to 107 characters.
    return record.directory / "kubelets" / str(index)


def _index(node: nodes.KubeletNode) -> int:
    """The node's index: its directory's name, its place on the fabric."""
    return int(node.directory.name)


class KubeletNodes:
    """A sandbox's fake-runtime kubelet nodes (``nodekinds.NodeKind``)."""

    def __init__(self, record: state.SandboxState, planned: Sequence[nodes.KubeletNode]) -> None:
        self._record = record
        self._nodes = list(planned)

    @property
    def kind(self) -> str:
        return KIND

    @property
    def names(self) -> list[str]:
        return list(self._record.kubelet_nodes)

    def attachments(self) -> list[networking.Attachment]:
        return [
            networking.Attachment(
                name=node.name,
                index=_index(node),
                published=(node.port, node.healthz_port),
                mount=functools.partial(nodes.mount_node_paths, node),
            )
            for node in self._nodes
        ]

    async def start(self, starting: nodekinds.Starting) -> None:
        record = starting.record
        # The host's sysctls as they were, unless another sandbox's kubelets
        # changed them first: `down` writes them back (``hostsysctls``).
        hostsysctls.claim(record.directory)
        started = []
        for node in self._nodes:
            runtime = starting.launcher.launch(
                f"fake-cri/{node.name}",
                nodes.cri_argv(starting.binaries["kmm-fake-cri"], node),
                health_url=f"{node.cri_url}/healthz",
            )
            await health.wait_healthy(runtime, timeout=starting.timeout)
            # Its server, https://127.0.0.1:P, is the relay in the node's namespace.
            kubeconfig = starting.kubeconfig_for(
                nodes.identity(node.name), node.directory / "kubeconfig"
            )
            started.append(
                starting.launcher.launch(
                    f"kubelet/{node.name}",
                    nodes.kubelet_argv(
                        starting.binaries["kubelet"],
                        node,
                        holder=starting.holder(node.name),
                        kubeconfig=kubeconfig,
                        config=nodes.write_config(
                            node,
                            ca_cert=starting.credentials.ca_cert,
                            feature_gates=starting.kubelet_feature_gates,
                        ),
                        address=str(addressing.node_address(_index(node))),
                        labels={nodekinds.KUBELET_NODE_LABEL: "true"},
                    ),
                    health_url=node.health_url,
                )
            )
        await asyncio.gather(*(health.wait_healthy(p, timeout=starting.timeout) for p in started))
        await nodekinds.wait_kubelets_ready(
            record, self.names, timeout=starting.timeout, log=started[0].log
        )

    def _processes(self) -> set[str]:
        return {f"{what}/{name}" for name in self.names for what in ("kubelet", "fake-cri")}

    def stop(self) -> None:
        try:
            launching.stop(self._record, self._processes().__contains__)
        finally:
            hostsysctls.release(self._record.directory)

    async def restart(self, name: str, *, timeout: float) -> None:
        index = launching.find(self._record, f"kubelet/{name}")
        await self._record.launched[index].stop_async()
        await launching.relaunch(self._record, index, timeout=timeout)
        await nodekinds.wait_kubelets_ready(
            self._record, [name], timeout=timeout, log=self._record.launched[index].log
        )

    async def status(self) -> list[nodekinds.NodeInfo]:
        return self.describe()

    def describe(self) -> list[nodekinds.NodeInfo]:
        return [
            nodekinds.NodeInfo(
                name=node.name,
                kind=KIND,
                address=str(addressing.node_address(_index(node))),
                details=(("runtime", "fake"),),
            )
            for node in self._nodes
        ]


def plan(record: state.SandboxState, free: Sequence[int]) -> KubeletNodes:
    """One node per name in ``record.kubelet_nodes``, each with three of the
    ``free`` host ports (kubelet, healthz, the fake runtime's HTTP side),
    its files and ports recorded in its directory."""
    planned = []
    for index, name in enumerate(record.kubelet_nodes):
        port, healthz_port, cri_port = free[3 * index : 3 * index + 3]
        node = nodes.KubeletNode(
            name=name,
            directory=_directory(record, index),
            port=port,
            healthz_port=healthz_port,
            cri_http_port=cri_port,
        )
        node.make_dirs()
        nodes.save(node)
        planned.append(node)
    return KubeletNodes(record, planned)


def of(record: state.SandboxState) -> KubeletNodes | None:
    """A running sandbox's fake-runtime kubelet nodes (None when it has none)."""
    if not record.kubelet_nodes or record.container_nodes:
        return None
    found = []
    for index, _ in enumerate(record.kubelet_nodes):
        try:
            found.append(nodes.load(_directory(record, index)))
        except (OSError, ValueError, KeyError):
            continue
    return KubeletNodes(record, found)
