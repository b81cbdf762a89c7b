"""One interface for every kind of node a sandbox runs.

A sandbox's nodes come in kinds, each a sub-package whose ``kind`` module
implements ``NodeKind``:

- ``kwoknodes``: Node objects KWOK keeps Ready (nothing runs on them);
- ``kubeletnodes``: real kubelets on a fake container runtime;
- ``containernodes``: real kubelets on containerd and runc, pods in real
  containers, each node in namespaces of its own on the host;
- ``vmnodes``: qemu guests running Debian's kernels, their own kubelet,
  containerd, runc, CNI and kube-proxy.

``cluster.up`` plans each kind asked for (the kind module's ``plan``: its
nodes' names, files and ports, before anything starts), makes the network
namespaces their ``attachments`` ask for (``networking``, before the API
server), starts the control plane, then each kind (``start``, which returns
once its nodes are Ready). ``cluster.down`` stops each kind (``stop``: its
nodes' processes and whatever they leave behind), then the rest. ``kmm
sandbox status`` shows what each kind ``describe``s from its files and, for
nodes with more to say than their files, what ``status`` asks of them;
``restarting.restart`` of a node's name restarts it the kind's way. A
running sandbox's kinds are found again from its record (each kind module's
``of``), so the CLI's commands and the tests use one path.

``wait_ready`` is what every kind with real kubelets waits on: the Node
objects Ready, untainted by the node lifecycle controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kmm.kube import client, kubeconfigs, objects, resources
from kmm.sandbox import errors, namespaces, networking, pki, processes, state

__all__ = [
    "KUBELET_NODE_LABEL",
    "Launcher",
    "NodeInfo",
    "NodeKind",
    "Starting",
    "schedulable_ready",
    "wait_kubelets_ready",
    "wait_ready",
]

# Nodes with a real kubelet (of any kind) carry this label; KWOK's do not.
KUBELET_NODE_LABEL = "kmm.sandbox/kubelet"


class Launcher(namespaces.Launcher, Protocol):
    """The sandbox's launcher (``launching.Launcher``), which records what it starts."""

    record: state.SandboxState


@dataclasses.dataclass(frozen=True)
class Starting:
    """What a kind's ``start`` works with: the launcher (and through it the
    record), the built binaries, the sandbox's PKI and a kubeconfig writer
    for its identities, the network (None without node namespaces), where
    the API server listens, the start timeout and the binary cache."""

    launcher: Launcher
    binaries: Mapping[str, Path]
    credentials: pki.Pki
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path]
    network: networking.Network | None
    api_port: int
    timeout: float
    cache_dir: Path
    # KubeletConfiguration.featureGates of every kubelet node started
    # (the release's: ``kubereleases``).
    kubelet_feature_gates: Mapping[str, bool] = dataclasses.field(default_factory=dict)

    @property
    def record(self) -> state.SandboxState:
        return self.launcher.record

    def holder(self, name: str) -> namespaces.Holder:
        """The holder of node ``name``'s namespaces."""
        assert self.network is not None, "nodes with namespaces need the network"
        return self.network.holders[name]


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """One node as ``status`` shows it: its name, its kind, its node IP on
    the fabric ("" for KWOK's) and what else its kind says of it, in order
    (column, value)."""

    name: str
    kind: str
    address: str = ""
    details: tuple[tuple[str, str], ...] = ()


class NodeKind(Protocol):
    """A kind of node, planned or found again in a running sandbox (see the
    module docstring)."""

    @property
    def kind(self) -> str:
        """``kwok``, ``kubelet``, ``containerd`` or ``vm``."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """Its nodes' names."""
        ...

    def attachments(self) -> Sequence[networking.Attachment]:
        """The node namespaces it needs on the fabric (none for KWOK's)."""
        ...

    async def start(self, starting: Starting) -> None:
        """Start its nodes once the control plane is healthy; return once
        their Node objects are Ready."""
        ...

    def stop(self) -> None:
        """Stop its nodes' processes and remove what they leave behind that
        is not a launched process (shims, cgroups, disks). Safe on a start
        that stopped half-way, and twice."""
        ...

    async def restart(self, name: str, *, timeout: float) -> None:
        """Restart node ``name`` the kind's way; return once it is Ready again."""
        ...

    async def status(self) -> list[NodeInfo]:
        """``describe``, with what only the running nodes can tell."""
        ...

    def describe(self) -> list[NodeInfo]:
        """Its nodes, from the sandbox's files alone."""
        ...


def schedulable_ready(node: Mapping[str, Any]) -> bool:
    """Whether a Node object is Ready and no longer tainted not-ready."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    # The node lifecycle controller taints a new node not-ready until it sees
    # Ready; waiting for the taint to go makes the sandbox usable at once.
    taints = (node.get("spec") or {}).get("taints") or ()
    return ready and not any(
        str(t.get("key", "")).startswith("node.kubernetes.io/") for t in taints
    )


async def wait_ready(
    api: client.Client, names: Sequence[str], *, timeout: float, label_selector: str
) -> None:
    """Return when every named node carrying ``label_selector`` is Ready and
    untainted; TimeoutError otherwise."""
    wanted = set(names)

    async def poll() -> None:
        while True:
            listing = await api.request(
                "GET", resources.NODES.path(), query={"labelSelector": label_selector}
            )
            ready = {objects.name(n) for n in listing["items"] if schedulable_ready(n)}
            if wanted <= ready:
                return
            await asyncio.sleep(0.25)

    await asyncio.wait_for(poll(), timeout)


async def wait_kubelets_ready(
    record: state.SandboxState, names: Sequence[str], *, timeout: float, log: Path
) -> None:
    """``wait_ready`` for nodes with real kubelets; ComponentFailed with the
    tail of ``log`` (the first node's kubelet log) when they are not Ready in
    ``timeout`` seconds."""
    async with client.Client(kubeconfigs.load(record.kubeconfig)) as api:
        try:
            await wait_ready(
                api, names, timeout=timeout, label_selector=f"{KUBELET_NODE_LABEL}=true"
            )
        except TimeoutError as err:
            raise errors.ComponentFailed(
                "kubelet",
                f"{len(names)} kubelet node(s) not Ready within {timeout:.0f} s",
                log,
                processes.log_tail(log),
            ) from err
