"""The sandbox's address plan: every non-loopback address it uses, in one place.

Kubelet nodes live in network namespaces of their own, joined by a fabric (a
bridge in one more namespace); the host's namespace keeps loopback only. Every
address below exists only inside those namespaces, and no namespace has a
default route, so a packet for anything outside has nowhere to go: the
sandbox can dial nothing but loopback and itself.

- ``FABRIC``: the fabric's bridge and each node's end of its link to it.
  ``GATEWAY`` (the bridge's own address) is where the sandbox serves the API
  server (the ``kubernetes`` Service's endpoint) and the registry to nodes and
  pods, through relays to the host's loopback.
- ``POD_NETWORK``: pods of container nodes, one ``/24`` per node, routed
  between nodes across the fabric. KWOK's pods (nothing runs) keep
  ``KWOK_POD_NETWORK``, which nothing routes.
- ``SERVICE_NETWORK``: ClusterIPs, translated by kube-proxy in each node.

Limits: at most ``MAX_NODES`` kubelet nodes; IPv4 only.
"""

from __future__ import annotations

import ipaddress
from typing import Final

__all__ = [
    "FABRIC",
    "GATEWAY",
    "KUBERNETES_SERVICE_IP",
    "KWOK_NODE_IP",
    "KWOK_POD_NETWORK",
    "MAX_NODES",
    "POD_NETWORK",
    "REGISTRY_PORT",
    "SERVICE_NETWORK",
    "node_address",
    "pod_subnet",
    "sandbox_networks",
]

FABRIC: Final = ipaddress.IPv4Network("10.253.0.0/24")
GATEWAY: Final = ipaddress.IPv4Address("10.253.0.1")
# The first node's fabric address is .10: .2-.9 stay free for the sandbox's
# own services, should it need more than the gateway.
_FIRST_NODE_HOST: Final = 10
MAX_NODES: Final = 240
POD_NETWORK: Final = ipaddress.IPv4Network("10.245.0.0/16")
KWOK_POD_NETWORK: Final = ipaddress.IPv4Network("10.244.0.0/16")
# What KWOK reports as its nodes' address: nothing listens there, nothing dials it.
KWOK_NODE_IP: Final = ipaddress.IPv4Address("10.200.0.1")
SERVICE_NETWORK: Final = ipaddress.IPv4Network("10.96.0.0/12")
KUBERNETES_SERVICE_IP: Final = ipaddress.IPv4Address("10.96.0.1")
# The registry's port on the gateway (each namespace has ports of its own,
# so a fixed one collides with nothing on the host).
REGISTRY_PORT: Final = 5000


def _check_index(index: int) -> None:
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"kubelet node index {index} is outside 0..{MAX_NODES - 1}")


def node_address(index: int) -> ipaddress.IPv4Address:
    """Kubelet node ``index``'s address on the fabric: its node IP."""
    _check_index(index)
    return FABRIC.network_address + _FIRST_NODE_HOST + index


def pod_subnet(index: int) -> ipaddress.IPv4Network:
    """The ``/24`` of ``POD_NETWORK`` that kubelet node ``index``'s pods get."""
    _check_index(index)
    return ipaddress.IPv4Network((int(POD_NETWORK.network_address) + (index << 8), 24))


def sandbox_networks() -> tuple[ipaddress.IPv4Network, ...]:
    """Every network a sandbox component may dial besides loopback: what the
    relay's CONNECT proxy checks a destination against."""
    return (FABRIC, POD_NETWORK, SERVICE_NETWORK)
