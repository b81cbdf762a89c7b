"""The address plan: node addresses and pod subnets never overlap each other
or anything else the sandbox routes."""

from __future__ import annotations

import itertools

import pytest

from kmm.sandbox import addressing


def test_node_addresses_are_distinct_fabric_hosts_other_than_the_gateway() -> None:
    addresses = [addressing.node_address(i) for i in range(addressing.MAX_NODES)]
    assert len(set(addresses)) == addressing.MAX_NODES
    assert all(a in addressing.FABRIC for a in addresses)
    assert addressing.GATEWAY not in addresses
    assert addressing.FABRIC.broadcast_address not in addresses
    assert str(addressing.node_address(0)) == "10.253.0.10"


def test_pod_subnets_are_disjoint_slices_of_the_pod_network() -> None:
    subnets = [addressing.pod_subnet(i) for i in range(addressing.MAX_NODES)]
    assert all(s.subnet_of(addressing.POD_NETWORK) for s in subnets)
    assert all(not a.overlaps(b) for a, b in itertools.combinations(subnets, 2))
    assert str(addressing.pod_subnet(3)) == "10.245.3.0/24"


def test_the_networks_the_sandbox_routes_do_not_overlap() -> None:
    networks = [*addressing.sandbox_networks(), addressing.KWOK_POD_NETWORK]
    assert all(not a.overlaps(b) for a, b in itertools.combinations(networks, 2))
    assert all(n.is_private for n in networks)
    assert addressing.KUBERNETES_SERVICE_IP in addressing.SERVICE_NETWORK


@pytest.mark.parametrize("index", [-1, addressing.MAX_NODES])
def test_an_index_out_of_range_is_refused(index: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        addressing.node_address(index)
    with pytest.raises(ValueError, match="outside"):
        addressing.pod_subnet(index)
