"""The fabric: the network joining the sandbox's kubelet-node namespaces.

One namespace of its own (holder ``fabric``) with a bridge ``kmmfab0``
holding ``addressing.GATEWAY/24``; each node namespace gets a veth link
``fab0`` with ``addressing.node_address(i)/24`` whose peer (``kmmn<i>``)
sits on the bridge. The link is created from *inside* the node namespace
with its peer placed straight into the fabric's, so no interface ever exists
in the host's namespace, not even for an instant.

A VM node's namespace is attached differently (``attach_bridged``): its
``fab0`` holds no address but is bridged (``kmmbr0``) with the tap its
guest's NIC is plugged into, so the guest itself holds the node's address on
the fabric, as a machine on the same wire; the namespace only carries its
frames.

Routes: each node reaches every other node's ``pod_subnet`` via that node's
fabric address and ``SERVICE_NETWORK`` via ``fab0`` (locally generated
traffic to a ClusterIP needs a route before kube-proxy's DNAT applies); the
fabric reaches each node's ``pod_subnet`` via the node. ``ip_forward`` is on
in all of them. A VM node's guest gets the same routes from its own
settings (``vmnodes``); its namespace needs none. No namespace gets a
default route: a packet for anything outside the sandbox's networks has no
route and is dropped where it is made.

Everything here lives in the holders' namespaces: stopping the holders
(``down``) removes the bridge, links, addresses and routes with them.

Limits: IPv4 only; nodes are attached once, never detached.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Final

from kmm.sandbox import addressing, namespaces

__all__ = [
    "BRIDGE",
    "NODE_BRIDGE",
    "NODE_INTERFACE",
    "Fabric",
    "attach",
    "attach_bridged",
    "create",
    "peer_name",
]

BRIDGE: Final = "kmmfab0"
NODE_INTERFACE: Final = "fab0"
# A VM node's namespace: the bridge joining its fabric link and its guest's tap.
NODE_BRIDGE: Final = "kmmbr0"
_PREFIX: Final = addressing.FABRIC.prefixlen


@dataclasses.dataclass
class Fabric:
    """The fabric's holder, the node namespaces attached so far (by index)
    that route, and the indices of the bridged ones (VM nodes')."""

    holder: namespaces.Holder
    directory: Path
    nodes: dict[int, namespaces.Holder] = dataclasses.field(default_factory=dict)
    bridged: set[int] = dataclasses.field(default_factory=set)

    def attached(self) -> list[int]:
        return sorted({*self.nodes, *self.bridged})


def peer_name(index: int) -> str:
    """The fabric-side name of node ``index``'s link (at most 15 characters)."""
    return f"kmmn{index}"


def _batch(holder: namespaces.Holder, commands: list[str]) -> None:
    # One `ip -batch` per namespace: one nsenter, not one per command.
    namespaces.run_in(holder, ["ip", "-batch", "-"], stdin="\n".join(commands) + "\n")


def _forward(holder: namespaces.Holder) -> None:
    # /proc/sys/net is the namespace of whoever opens it: nsenter's child.
    namespaces.run_in(holder, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])


def create(launcher: namespaces.Launcher, directory: Path) -> Fabric:
    """Start the fabric's holder and make its bridge."""
    holder = namespaces.start_holder(launcher, "fabric")
    _batch(
        holder,
        [
            f"link add {BRIDGE} type bridge",
            f"addr add {addressing.GATEWAY}/{_PREFIX} dev {BRIDGE}",
            f"link set {BRIDGE} up",
        ],
    )
    _forward(holder)
    return Fabric(holder=holder, directory=directory)


def _check_free(fab: Fabric, index: int) -> None:
    if index in fab.attached():
        raise ValueError(f"node {index} is attached to the fabric already")


def _route_to(fab: Fabric, index: int) -> None:
    """The fabric and every routing node reach node ``index``'s pods via it."""
    address = addressing.node_address(index)
    peer = peer_name(index)
    _batch(
        fab.holder,
        [
            f"link set {peer} master {BRIDGE}",
            f"link set {peer} up",
            f"route add {addressing.pod_subnet(index)} via {address}",
        ],
    )
    for other_holder in fab.nodes.values():
        _batch(other_holder, [f"route add {addressing.pod_subnet(index)} via {address}"])


def attach(fab: Fabric, node_holder: namespaces.Holder, index: int) -> None:
    """Link node ``index``'s namespace to the fabric and route between it
    and every node attached before."""
    _check_free(fab, index)
    address = addressing.node_address(index)
    peer = peer_name(index)
    commands = [
        f"link add {NODE_INTERFACE} type veth peer name {peer} netns {fab.holder.pid}",
        f"addr add {address}/{_PREFIX} dev {NODE_INTERFACE}",
        f"link set {NODE_INTERFACE} up",
        f"route add {addressing.SERVICE_NETWORK} dev {NODE_INTERFACE}",
    ]
    commands += [
        f"route add {addressing.pod_subnet(other)} via {addressing.node_address(other)}"
        for other in fab.attached()
    ]
    _batch(node_holder, commands)
    _forward(node_holder)
    _route_to(fab, index)
    fab.nodes[index] = node_holder


def attach_bridged(fab: Fabric, node_holder: namespaces.Holder, index: int, *, tap: str) -> None:
    """Link VM node ``index``'s namespace to the fabric as a wire for its
    guest: its link and the tap ``tap`` (made here, for qemu to open) on one
    bridge, no address in the namespace; the guest holds the node's address
    and routes (see the module docstring)."""
    _check_free(fab, index)
    peer = peer_name(index)
    _batch(
        node_holder,
        [
            f"link add {NODE_INTERFACE} type veth peer name {peer} netns {fab.holder.pid}",
            f"link add {NODE_BRIDGE} type bridge",
            f"tuntap add dev {tap} mode tap",
            f"link set {NODE_INTERFACE} master {NODE_BRIDGE}",
            f"link set {tap} master {NODE_BRIDGE}",
            f"link set {NODE_INTERFACE} up",
            f"link set {tap} up",
            f"link set {NODE_BRIDGE} up",
        ],
    )
    _route_to(fab, index)
    fab.bridged.add(index)
