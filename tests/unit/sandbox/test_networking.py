"""What the relay and the API server are told in a sandbox with kubelet nodes."""

from __future__ import annotations

import json
from pathlib import Path

from kmm.sandbox import addressing, fabric, namespaces, networking, relay


def test_the_relay_serves_the_api_server_to_nodes_and_kubelets_to_the_host(
    tmp_path: Path,
) -> None:
    fab = fabric.Fabric(holder=namespaces.Holder(pid=10), directory=tmp_path)
    nodes = [
        (
            networking.Attachment(
                name=f"kmm-kubelet-{i}", index=i, published=(20000 + i, 21000 + i)
            ),
            namespaces.Holder(pid=100 + i, mount=True),
        )
        for i in range(2)
    ]
    registry = relay.Forwarder(
        listen=relay.Endpoint("/proc/10/ns/net", str(addressing.GATEWAY), 5000),
        target=relay.Endpoint(None, "127.0.0.1", 40000),
    )
    config = networking.relay_config(
        fab,
        nodes,
        api_port=6443,
        health_port=7000,
        egress_socket=tmp_path / "egress.sock",
        extra=(registry,),
    )
    pairs = {
        (f.listen.netns, f.listen.host, f.listen.port): (
            f.target.netns,
            f.target.host,
            f.target.port,
        )
        for f in config.forwarders
    }
    api = (None, "127.0.0.1", 6443)
    assert pairs == {
        ("/proc/10/ns/net", "10.253.0.1", 5000): (None, "127.0.0.1", 40000),
        ("/proc/10/ns/net", "10.253.0.1", 6443): api,
        ("/proc/100/ns/net", "127.0.0.1", 6443): api,
        ("/proc/101/ns/net", "127.0.0.1", 6443): api,
        (None, "127.0.0.1", 20000): ("/proc/100/ns/net", "127.0.0.1", 20000),
        (None, "127.0.0.1", 21000): ("/proc/100/ns/net", "127.0.0.1", 21000),
        (None, "127.0.0.1", 20001): ("/proc/101/ns/net", "127.0.0.1", 20001),
        (None, "127.0.0.1", 21001): ("/proc/101/ns/net", "127.0.0.1", 21001),
    }
    assert len(config.forwarders) == len(pairs)
    assert config.connect == relay.ConnectProxy(
        socket=tmp_path / "egress.sock",
        netns="/proc/10/ns/net",
        allow=addressing.sandbox_networks(),
    )


def test_the_egress_selector_sends_cluster_traffic_to_the_relays_socket(tmp_path: Path) -> None:
    path = networking.egress_selector(tmp_path / "egress.json", tmp_path / "egress.sock")
    document = json.loads(path.read_text())
    assert document["apiVersion"] == "apiserver.k8s.io/v1beta1"
    assert document["kind"] == "EgressSelectorConfiguration"
    assert document["egressSelections"] == [
        {
            "name": "cluster",
            "connection": {
                "proxyProtocol": "HTTPConnect",
                "transport": {"uds": {"udsName": str(tmp_path / "egress.sock")}},
            },
        }
    ]


def test_a_vm_nodes_ports_are_its_guests_on_the_fabric_and_its_namespace_serves_nothing(
    tmp_path: Path,
) -> None:
    fab = fabric.Fabric(holder=namespaces.Holder(pid=10), directory=tmp_path)
    guest = networking.Attachment(
        name="kmm-vm-0", index=3, published=(30000, 30001, 30002), tap="kmmtap0"
    )
    config = networking.relay_config(
        fab,
        [(guest, namespaces.Holder(pid=103))],
        api_port=6443,
        health_port=7000,
        egress_socket=tmp_path / "egress.sock",
    )
    pairs = {
        (f.listen.netns, f.listen.host, f.listen.port): (
            f.target.netns,
            f.target.host,
            f.target.port,
        )
        for f in config.forwarders
    }
    address = str(addressing.node_address(3))
    assert pairs == {
        # The guest's kubeconfigs name the API server on the gateway.
        ("/proc/10/ns/net", "10.253.0.1", 6443): (None, "127.0.0.1", 6443),
        (None, "127.0.0.1", 30000): ("/proc/10/ns/net", address, 30000),
        (None, "127.0.0.1", 30001): ("/proc/10/ns/net", address, 30001),
        (None, "127.0.0.1", 30002): ("/proc/10/ns/net", address, 30002),
    }
