"""Start a sandbox's container nodes, and clear what they leave behind.

``plan`` picks a node's files and ports before the API server starts;
``network_options`` tells ``networking.start`` how a container node's
namespaces differ (its mounts, ``containernodes.mount_in``; its kube-proxy's
health port, published on the host's loopback by the relay). ``start`` runs
once the control plane is healthy: per node the cgroup parent, the CNI and
containerd files, containerd (and the local pause image imported), the
kubelet, then kube-proxy once the nodes are Ready. It returns when every
kube-proxy is healthy.

``clean_up`` is what ``down`` adds for container nodes once the launched
processes are stopped: the shims (sessions of their own, never in the
record) and every process and cgroup under the sandbox's cgroup parent. With
them gone the node namespaces lose their last process, and their mounts,
interfaces and iptables rules go too.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from kmm.sandbox import (
    containernodes,
    errors,
    fakemodules,
    health,
    kubeletnodes,
    namespaces,
    pki,
    ports,
    processes,
    state,
)

__all__ = ["Launcher", "clean_up", "import_image", "network_options", "plan", "start"]


class Launcher(namespaces.Launcher, Protocol):
    """The sandbox's launcher, as ``start`` uses it."""

    record: state.SandboxState


def plan(
    directory: Path,
    index: int,
    name: str,
    cgroup_parent: str,
    free: list[int],
    *,
    fake_modules: tuple[fakemodules.FakeModule, ...] = (),
) -> containernodes.ContainerNode:
    """Container node ``index``'s files and host ports (three ``free`` ones:
    the kubelet's, its healthz and kube-proxy's health), recorded in its
    directory, with the fake modules' devices laid out."""
    port, healthz_port, proxy_port = free
    node = containernodes.ContainerNode(
        kubelet=kubeletnodes.KubeletNode(
            name=name,
            # Short: unix socket paths under it are limited to 107 characters.
            directory=directory / "kubelets" / str(index),
            port=port,
            healthz_port=healthz_port,
            cri_http_port=0,
        ),
        index=index,
        proxy_healthz_port=proxy_port,
        cgroup_root=f"/{cgroup_parent}/{name}",
        fake_modules=fake_modules,
    )
    node.make_dirs()
    containernodes.save(node)
    return node


def network_options(planned: list[containernodes.ContainerNode]) -> dict[str, Any]:
    """``networking.start``'s ``mount`` and ``published`` for these nodes."""
    by_name = {node.name: node for node in planned}

    def mount(node: kubeletnodes.KubeletNode, holder: namespaces.Holder) -> None:
        containernodes.mount_in(by_name[node.name], holder)

    def published(node: kubeletnodes.KubeletNode) -> tuple[int, ...]:
        return (by_name[node.name].proxy_healthz_port,)

    return {"mount": mount, "published": published}


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
    planned: list[tuple[containernodes.ContainerNode, namespaces.Holder]],
    binaries: dict[str, Path],
    pinned: Path,
    credentials: pki.Pki,
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path],
    *,
    pause_archive: Path,
    labels: dict[str, str],
    timeout: float,
    wait_ready: Callable[[list[str]], Awaitable[None]],
) -> None:
    """Start the planned container nodes in their holders' namespaces (see
    the module docstring)."""
    if not pause_archive.is_file():
        raise errors.SandboxError(
            f"container nodes need the pause image archive {pause_archive} "
            "(`make test-images` writes build/images/pause.tar)"
        )
    kubelets: list[processes.Process] = []
    for node, holder in planned:
        containernodes.create_cgroups(node.cgroup_root)
        containernodes.write_cni_files(node, binaries)
        containernodes.write_containerd_files(
            node, runc=binaries["runc"], ca_cert=credentials.ca_cert
        )
        containerd = launcher.launch(
            f"containerd/{node.name}",
            containernodes.containerd_argv(holder, binaries["containerd"], node, pinned),
            health_url="",
        )
        await _wait_socket(containerd, node.containerd_socket, timeout=timeout)
        await asyncio.to_thread(import_image, binaries["ctr"], node, pause_archive)
        # Its server, https://127.0.0.1:P, is the relay in the node's namespace.
        kubeconfig = kubeconfig_for(kubeletnodes.identity(node.name), node.directory / "kubeconfig")
        kubelets.append(
            launcher.launch(
                f"kubelet/{node.name}",
                containernodes.kubelet_argv(
                    holder,
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
    await wait_ready([node.name for node, _ in planned])
    proxies = []
    for node, holder in planned:
        kubeconfig = kubeconfig_for(
            containernodes.proxy_identity(node.name), node.directory / "kube-proxy.kubeconfig"
        )
        proxies.append(
            launcher.launch(
                f"kube-proxy/{node.name}",
                containernodes.kube_proxy_argv(
                    holder, binaries["kube-proxy"], node, kubeconfig=kubeconfig
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
