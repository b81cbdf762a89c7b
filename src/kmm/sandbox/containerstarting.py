"""Start a sandbox's container nodes, and clear what they leave behind.

``start`` runs after the control plane is healthy: the fabric's holder, one
holder per node (``containernodes``: network and mount namespaces with the
node's mounts), each attached to the fabric; then the relay, which serves
the API server's port on 127.0.0.1 inside every node namespace and on the
gateway in the fabric's (the ``kubernetes`` Service's endpoint), publishes
each node's kubelet and health ports on the host's loopback, and proxies the
API server's CONNECTs to node addresses; then per node containerd (with the
local pause image imported), the kubelet and kube-proxy. It returns when
every node is Ready and its kube-proxy healthy.

``clean_up`` is what ``down`` adds for container nodes once the launched
processes are stopped: the shims (sessions of their own, never in the
record) and every process and cgroup under the sandbox's cgroup parent. With
them gone the node namespaces lose their last process, and their mounts,
interfaces and iptables rules go too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from kmm.sandbox import (
    addressing,
    containernodes,
    errors,
    fabric,
    health,
    kubeletnodes,
    namespaces,
    pki,
    ports,
    processes,
    relay,
    state,
)

__all__ = [
    "EGRESS_SOCKET",
    "KUBELET_CLIENT",
    "apiserver_flags",
    "clean_up",
    "egress_config",
    "import_image",
    "start",
]

# The API server's egress selector dials kubelets through this unix socket
# (the relay's CONNECT proxy), relative to the sandbox directory.
EGRESS_SOCKET: Final = Path("relay") / "egress.sock"
# The API server's identity towards kubelets (they authorize it through the
# API server itself: system:masters may do anything, as kubeadm's may).
KUBELET_CLIENT: Final = pki.ClientIdentity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
)


class Launcher(namespaces.Launcher, Protocol):
    """The sandbox's launcher, as ``start`` uses it."""

    record: state.SandboxState


def egress_config(directory: Path) -> Path:
    """The API server's EgressSelectorConfiguration: the ``cluster`` selection
    (kubelets: logs, exec, port-forward) over HTTP CONNECT on the relay's
    socket, so node addresses are dialled from the fabric, not the host."""
    path = directory / "egress-selector.yaml"
    document = {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(directory / EGRESS_SOCKET)}},
                },
            }
        ],
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def apiserver_flags(directory: Path, credentials: pki.Pki) -> list[str]:
    """The API server's flags for a sandbox with container nodes: the
    ``kubernetes`` EndpointSlice says the gateway (served there by the relay;
    the API server itself still binds loopback only), kubelets via CONNECT,
    and a client certificate the kubelets accept (``pods/log``, ``exec``)."""
    return [
        f"--kubelet-client-certificate={credentials.client_cert(KUBELET_CLIENT)}",
        f"--kubelet-client-key={credentials.client_key(KUBELET_CLIENT)}",
        f"--advertise-address={addressing.GATEWAY}",
        # A node's Hostname address names nothing the relay may dial.
        "--kubelet-preferred-address-types=InternalIP",
        f"--egress-selector-config-file={egress_config(directory)}",
    ]


def _relay_config(
    record: state.SandboxState,
    fab: fabric.Fabric,
    started: list[tuple[containernodes.ContainerNode, namespaces.Holder]],
    health_port: int,
) -> relay.Config:
    api_port = int(urllib.parse.urlsplit(record.server).port or 0)
    host_api = relay.Endpoint(None, ports.HOST, api_port)
    forwarders = [
        relay.Forwarder(
            relay.Endpoint(fab.holder.net_path, str(addressing.GATEWAY), api_port), host_api
        )
    ]
    for node, holder in started:
        forwarders.append(
            relay.Forwarder(relay.Endpoint(holder.net_path, ports.HOST, api_port), host_api)
        )
        for port in (node.kubelet.port, node.kubelet.healthz_port, node.proxy_healthz_port):
            forwarders.append(
                relay.Forwarder(
                    relay.Endpoint(None, ports.HOST, port),
                    relay.Endpoint(holder.net_path, ports.HOST, port),
                )
            )
    return relay.Config(
        health_port=health_port,
        forwarders=tuple(forwarders),
        connect=relay.ConnectProxy(
            socket=record.directory / EGRESS_SOCKET,
            netns=fab.holder.net_path,
            allow=addressing.sandbox_networks(),
        ),
    )


def import_image(ctr: Path, node: containernodes.ContainerNode, archive: Path) -> None:
    """Import an OCI archive into the node's containerd (namespace k8s.io,
    the CRI's), as a local image the kubelet never pulls."""
    result = subprocess.run(
        [
            str(ctr),
            f"--address={node.containerd_socket}",
            "--namespace=k8s.io",
            "images",
            "import",
            "--no-unpack=false",
            str(archive),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise errors.SandboxError(
            f"ctr could not import {archive} into {node.name}'s containerd: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )


async def _wait_socket(process: processes.Process, path: Path, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not process.alive() or time.monotonic() > deadline:
            raise errors.ComponentFailed(
                process.name,
                f"did not open {path}",
                process.log,
                processes.log_tail(process.log),
            )
        await asyncio.sleep(0.1)


async def start(
    launcher: Launcher,
    names: list[str],
    binaries: dict[str, Path],
    pinned: Path,
    credentials: pki.Pki,
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path],
    *,
    pause_archive: Path,
    labels: dict[str, str],
    timeout: float,
    wait_ready: Callable[[list[str]], Any],
) -> None:
    """Start the container nodes ``names`` (see the module docstring)."""
    record = launcher.record
    if not pause_archive.is_file():
        raise errors.SandboxError(
            f"container nodes need the pause image archive {pause_archive} "
            "(`make test-images` writes build/images/pause.tar)"
        )
    fab = fabric.create(launcher, record.directory)
    started: list[tuple[containernodes.ContainerNode, namespaces.Holder]] = []
    for index, name in enumerate(names):
        port, healthz_port, proxy_port = ports.free_ports(3)
        node = containernodes.ContainerNode(
            kubelet=kubeletnodes.KubeletNode(
                name=name,
                directory=record.directory / "kubelets" / str(index),
                port=port,
                healthz_port=healthz_port,
                cri_http_port=0,
            ),
            index=index,
            proxy_healthz_port=proxy_port,
            cgroup_root=f"/{record.cgroup_parent}/{name}",
        )
        node.make_dirs()
        containernodes.save(node)
        plan = containernodes.mount_plan(node)
        containernodes.check_directory(record.directory, plan.overlays)
        process = launcher.launch(
            f"node/{name}", containernodes.holder_argv(node, plan), health_url=""
        )
        containernodes.wait_holder(node, process.pid, timeout=timeout)
        holder = namespaces.Holder(pid=process.pid, mount=True)
        fabric.attach(fab, holder, index)
        started.append((node, holder))
    (relay_port,) = ports.free_ports(1)
    config = relay.write(
        _relay_config(record, fab, started, relay_port),
        record.directory / "relay" / "relay.json",
    )
    relay_process = launcher.launch(
        "relay", relay.argv(config), health_url=f"http://{ports.HOST}:{relay_port}/healthz"
    )
    await health.wait_healthy(relay_process, timeout=timeout)

    kubelets: list[processes.Process] = []
    for node, holder in started:
        containernodes.create_cgroups(node.cgroup_root)
        containernodes.write_cni_files(node, binaries)
        containernodes.write_containerd_files(
            node, runc=binaries["runc"], ca_cert=credentials.ca_cert
        )
        containerd = launcher.launch(
            f"containerd/{node.name}",
            containernodes.containerd_argv(holder.pid, binaries["containerd"], node, pinned),
            health_url="",
        )
        await _wait_socket(containerd, node.containerd_socket, timeout=timeout)
        await asyncio.to_thread(import_image, binaries["ctr"], node, pause_archive)
        kubeconfig = kubeconfig_for(kubeletnodes.identity(node.name), node.directory / "kubeconfig")
        kubelets.append(
            launcher.launch(
                f"kubelet/{node.name}",
                containernodes.kubelet_argv(
                    holder.pid,
                    binaries["kubelet"],
                    node,
                    kubeconfig=kubeconfig,
                    config=containernodes.write_kubelet_config(node, ca_cert=credentials.ca_cert),
                    labels=labels,
                ),
                health_url=node.kubelet.health_url,
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=timeout) for p in kubelets))
    await wait_ready(names)
    proxies = []
    for node, holder in started:
        kubeconfig = kubeconfig_for(
            containernodes.proxy_identity(node.name), node.directory / "kube-proxy.kubeconfig"
        )
        proxies.append(
            launcher.launch(
                f"kube-proxy/{node.name}",
                containernodes.kube_proxy_argv(
                    holder.pid, binaries["kube-proxy"], node, kubeconfig=kubeconfig
                ),
                health_url=f"http://{ports.HOST}:{node.proxy_healthz_port}/healthz",
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=timeout) for p in proxies))


def clean_up(record: state.SandboxState) -> None:
    """After the launched processes stopped: kill each container node's shims,
    then every process under the sandbox's cgroup parent, and remove its
    cgroups. SandboxError naming what would not go."""
    for index, _ in enumerate(record.kubelet_nodes):
        directory = record.directory / "kubelets" / str(index)
        try:
            node = containernodes.load(directory)
        except (OSError, ValueError, KeyError):
            continue
        if node is not None:
            containernodes.kill_shims(node.containerd_socket)
    if record.cgroup_parent:
        left = containernodes.remove_cgroups(f"/{record.cgroup_parent}")
        if left:
            raise errors.SandboxError(
                "could not remove the sandbox's cgroups (processes still in them?): "
                + ", ".join(str(path) for path in left)
            )
