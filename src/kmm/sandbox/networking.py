"""The network of a sandbox with kubelet nodes, set up before its API server.

``start`` makes the fabric (``fabric``), one holder per kubelet node with
its network and mount namespaces (``namespaces``) linked to the fabric, and
launches the relay (``relay``) that joins them to the host's loopback:

- the API server, bound to the host's 127.0.0.1:P and advertising
  ``addressing.GATEWAY``, is served on GATEWAY:P in the fabric (the
  ``kubernetes`` Service's endpoint) and on 127.0.0.1:P in every node
  namespace (what kubelet kubeconfigs name);
- each kubelet's port and healthz port are published on the host's
  127.0.0.1 under the same numbers, so node records, health URLs and
  callers on the host are as they were (a VM node's are its guest's, dialled
  at the node IP from the fabric: inside a guest 127.0.0.1 is the guest's
  own, and its kubeconfigs name GATEWAY:P);
- the API server reaches kubelets through its egress selector
  (``apiserver_flags``): selection ``cluster``, HTTPConnect over the relay's
  unix socket, dialled from the fabric namespace, limited to
  ``addressing.sandbox_networks()``.

Nothing here adds anything but loopback listeners to the host's network
namespace; stopping the holders (``down``, after the relay) removes the rest.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from kmm.sandbox import (
    addressing,
    fabric,
    namespaces,
    ports,
    processes,
    relay,
)

__all__ = [
    "Attachment",
    "Network",
    "apiserver_flags",
    "egress_selector",
    "relay_config",
    "start",
]


@dataclasses.dataclass(frozen=True)
class Attachment:
    """One node's namespaces on the fabric: its name, its index there (its
    node IP is ``addressing.node_address(index)``), the ports of its loopback
    published on the host's under the same numbers (its kubelet's, healthz
    ...), and what makes its mounts in a private mount namespace of its own
    (None: a network namespace only).

    With ``tap`` the node is a VM's: its namespace is a wire to the fabric
    for the guest on that tap (``fabric.attach_bridged``), which holds the
    node IP itself; its published ports are the guest's, on the node IP."""

    name: str
    index: int
    published: tuple[int, ...] = ()
    mount: Callable[[namespaces.Holder], None] | None = None
    tap: str = ""


@dataclasses.dataclass(frozen=True)
class Network:
    """What ``start`` made: the fabric, each node's holder (by node name),
    the relay process and where its files are."""

    fab: fabric.Fabric
    holders: dict[str, namespaces.Holder]
    relay: processes.Process
    egress_socket: Path
    egress_config: Path


def relay_config(
    fab: fabric.Fabric,
    nodes: Sequence[tuple[Attachment, namespaces.Holder]],
    *,
    api_port: int,
    health_port: int,
    egress_socket: Path,
    extra: Sequence[relay.Forwarder] = (),
    registry_port: int = 0,
) -> relay.Config:
    """The relay's forwarders and CONNECT proxy (see the module docstring);
    ``extra`` forwarders are added as they are (e.g. a registry on the gateway);
    ``registry_port``, when not 0, is the host loopback port of the sandbox
    registry, served on GATEWAY:REGISTRY_PORT in the fabric (how nodes and
    pods pull from it)."""
    api = relay.Endpoint(None, ports.HOST, api_port)
    forwarders = [
        *extra,
        *(
            [
                relay.Forwarder(
                    listen=relay.Endpoint(
                        fab.holder.net_path, str(addressing.GATEWAY), addressing.REGISTRY_PORT
                    ),
                    target=relay.Endpoint(None, ports.HOST, registry_port),
                )
            ]
            if registry_port
            else []
        ),
        relay.Forwarder(
            listen=relay.Endpoint(fab.holder.net_path, str(addressing.GATEWAY), api_port),
            target=api,
        ),
    ]
    for node, holder in nodes:
        if node.tap:
            # A guest's 127.0.0.1 is its own: it names the gateway (above),
            # and its ports are dialled at its address on the fabric.
            guest = str(addressing.node_address(node.index))
            forwarders += [
                relay.Forwarder(
                    listen=relay.Endpoint(None, ports.HOST, port),
                    target=relay.Endpoint(fab.holder.net_path, guest, port),
                )
                for port in node.published
            ]
            continue
        forwarders.append(
            relay.Forwarder(
                listen=relay.Endpoint(holder.net_path, "127.0.0.1", api_port), target=api
            )
        )
        forwarders += [
            relay.Forwarder(
                listen=relay.Endpoint(None, ports.HOST, port),
                target=relay.Endpoint(holder.net_path, "127.0.0.1", port),
            )
            for port in node.published
        ]
    return relay.Config(
        health_port=health_port,
        forwarders=tuple(forwarders),
        connect=relay.ConnectProxy(
            socket=egress_socket,
            netns=fab.holder.net_path,
            allow=addressing.sandbox_networks(),
        ),
    )


def egress_selector(path: Path, socket: Path) -> Path:
    """Write the API server's EgressSelectorConfiguration: selection
    ``cluster`` (kubelets, node/pod/service proxies) over HTTP CONNECT on the
    relay's unix socket."""
    # JSON is YAML; the API server reads either.
    document = {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(socket)}},
                },
            }
        ],
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def start(
    launcher: namespaces.Launcher,
    directory: Path,
    nodes: Sequence[Attachment],
    *,
    api_port: int,
    health_port: int,
    extra: Sequence[relay.Forwarder] = (),
    registry_port: int = 0,
) -> Network:
    """Make the fabric and the nodes' namespaces, then launch the relay
    (the caller waits for its health: ``Network.relay.health_url``); see
    ``relay_config``."""
    fab = fabric.create(launcher, directory)
    holders: dict[str, namespaces.Holder] = {}
    for node in nodes:
        holder = namespaces.start_holder(
            launcher, f"node/{node.name}", mount=node.mount is not None
        )
        if node.tap:
            fabric.attach_bridged(fab, holder, node.index, tap=node.tap)
        else:
            fabric.attach(fab, holder, node.index)
        if node.mount is not None:
            node.mount(holder)
        holders[node.name] = holder
    relay_dir = directory / "relay"
    relay_dir.mkdir(parents=True, exist_ok=True)
    egress_socket = relay_dir / "egress.sock"
    config = relay_config(
        fab,
        [(node, holders[node.name]) for node in nodes],
        api_port=api_port,
        health_port=health_port,
        egress_socket=egress_socket,
        extra=extra,
        registry_port=registry_port,
    )
    process = launcher.launch(
        "relay",
        relay.argv(relay.write(config, relay_dir / "relay.json")),
        health_url=f"http://{ports.HOST}:{health_port}/healthz",
    )
    return Network(
        fab=fab,
        holders=holders,
        relay=process,
        egress_socket=egress_socket,
        egress_config=egress_selector(relay_dir / "egress-selector.json", egress_socket),
    )


def apiserver_flags(network: Network) -> list[str]:
    """How the API server of a sandbox with kubelet nodes reaches them (it
    also advertises ``addressing.GATEWAY``: ``cluster``'s flags)."""
    return [
        f"--egress-selector-config-file={network.egress_config}",
        # A node's Hostname address is its name, which nothing resolves (and
        # the CONNECT proxy refuses names): dial the node IP.
        "--kubelet-preferred-address-types=InternalIP",
    ]
