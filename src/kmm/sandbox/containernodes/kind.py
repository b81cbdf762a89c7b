"""The sandbox's container nodes behind the node interface (``nodekinds.NodeKind``).

``plan`` lays out node ``i`` in ``<sandbox>/kubelets/<i>/`` with three host
ports (kubelet, healthz, kube-proxy's health) and its cgroup under the
sandbox's parent; its namespaces go on the fabric at index ``i``
(``attachments``: the node's own mounts, its three ports published on the
host's loopback). ``start`` is ``starting.start``. ``stop`` stops each
node's kube-proxy, kubelet and containerd, then what they leave outside
their namespaces: the shims (sessions of their own, never in the record)
and every process and cgroup under the sandbox's cgroup parent. With the
holders stopped after it (``cluster.down``) the node namespaces lose their
last process, and their mounts, interfaces and iptables rules go too; the
host sysctls the kubelets changed come back once no other sandbox's
kubelets hold them (``hostsysctls``).
``restart`` restarts a node's containerd, kubelet and kube-proxy, as a
machine restarts those services: its containers keep running.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from kmm.sandbox import errors, hostsysctls, launching, networking, nodekinds, pki, state
from kmm.sandbox.containernodes import cgroups, fakemodules, nodes, starting
from kmm.sandbox.kubeletnodes import kind as kubeletkind

__all__ = ["KIND", "ContainerNodes", "identities", "of", "plan"]

KIND = nodes.RUNTIME
# A node's processes, in the order they start.
_SERVICES = ("containerd", "kubelet", "kube-proxy")


def identities(planned: Sequence[str]) -> list[pki.ClientIdentity]:
    """The client identities these nodes' kubelets and kube-proxies authenticate with."""
    return [
        *kubeletkind.identities(planned),
        *(nodes.proxy_identity(name) for name in planned),
    ]


class ContainerNodes:
    """A sandbox's container nodes (``nodekinds.NodeKind``)."""

    def __init__(
        self,
        record: state.SandboxState,
        planned: Sequence[nodes.ContainerNode],
        *,
        pinned: Path | None = None,
        pause_archive: Path | None = None,
    ) -> None:
        self._record = record
        self._nodes = list(planned)
        self._pinned = pinned
        self._pause_archive = pause_archive

    @property
    def kind(self) -> str:
        return KIND

    @property
    def names(self) -> list[str]:
        return list(self._record.container_nodes)

    def attachments(self) -> list[networking.Attachment]:
        return [
            networking.Attachment(
                name=node.name,
                index=node.index,
                published=(node.kubelet.port, node.kubelet.healthz_port, node.proxy_healthz_port),
                mount=functools.partial(nodes.mount_in, node),
            )
            for node in self._nodes
        ]

    async def start(self, starting_: nodekinds.Starting) -> None:
        # Planned (``plan``), not found again (``of``): only a plan starts.
        assert self._pinned is not None
        assert self._pause_archive is not None
        # The host's sysctls as they were, unless another sandbox's kubelets
        # changed them first: `down` writes them back (``hostsysctls``).
        hostsysctls.claim(starting_.record.directory)
        await starting.start(
            starting_,
            self._nodes,
            pinned=self._pinned,
            pause_archive=self._pause_archive,
            labels={nodekinds.KUBELET_NODE_LABEL: "true"},
        )

    def _processes(self) -> set[str]:
        return {f"{service}/{name}" for name in self.names for service in _SERVICES}

    def stop(self) -> None:
        """See the module docstring; SandboxError naming the cgroups that
        would not go."""
        try:
            launching.stop(self._record, self._processes().__contains__)
            for node in self._nodes:
                cgroups.kill_shims(node.containerd_socket)
            if self._record.cgroup_parent:
                left = cgroups.remove_cgroups(f"/{self._record.cgroup_parent}")
                if left:
                    raise errors.SandboxError(
                        "could not remove the sandbox's cgroups (processes still in them?): "
                        + ", ".join(str(path) for path in left)
                    )
        finally:
            # Whatever could not be removed, the host's sysctls come back.
            hostsysctls.release(self._record.directory)

    async def restart(self, name: str, *, timeout: float) -> None:
        node = next((node for node in self._nodes if node.name == name), None)
        if node is None:
            raise errors.NotRunning(f"the sandbox in {self._record.directory} has no node {name}")
        indices = [launching.find(self._record, f"{service}/{name}") for service in _SERVICES]
        for index in reversed(indices):
            await self._record.launched[index].stop_async()
        containerd, kubelet, proxy = indices
        node.containerd_socket.unlink(missing_ok=True)
        again = await launching.relaunch(self._record, containerd, timeout=timeout)
        await starting.wait_socket(again, node.containerd_socket, timeout=timeout)
        await launching.relaunch(self._record, kubelet, timeout=timeout)
        await nodekinds.wait_kubelets_ready(
            self._record, [name], timeout=timeout, log=self._record.launched[kubelet].log
        )
        await launching.relaunch(self._record, proxy, timeout=timeout)

    async def status(self) -> list[nodekinds.NodeInfo]:
        return self.describe()

    def describe(self) -> list[nodekinds.NodeInfo]:
        return [
            nodekinds.NodeInfo(
                name=node.name, kind=KIND, address=node.address, details=(("runtime", KIND),)
            )
            for node in self._nodes
        ]


def plan(
    record: state.SandboxState,
    free: Sequence[int],
    *,
    fake_modules: tuple[fakemodules.FakeModule, ...],
    pinned: Path,
    pause_archive: Path,
) -> ContainerNodes:
    """One node per name in ``record.container_nodes``, each with three of
    the ``free`` host ports (see ``starting.plan``)."""
    planned = [
        starting.plan(
            record.directory,
            index,
            name,
            record.cgroup_parent,
            list(free[3 * index : 3 * index + 3]),
            fake_modules=fake_modules,
        )
        for index, name in enumerate(record.container_nodes)
    ]
    return ContainerNodes(record, planned, pinned=pinned, pause_archive=pause_archive)


def of(record: state.SandboxState) -> ContainerNodes | None:
    """A running sandbox's container nodes (None when it has none)."""
    if not record.container_nodes:
        return None
    found = []
    for index, _ in enumerate(record.container_nodes):
        try:
            node = nodes.load(record.directory / "kubelets" / str(index))
        except (OSError, ValueError, KeyError):
            continue
        if node is not None:
            found.append(node)
    return ContainerNodes(record, found)
