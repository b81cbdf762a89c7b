"""Plan a sandbox's container nodes, and start them.

``plan`` picks a node's files and ports before the API server starts.
``start`` runs once the control plane is healthy: per node the cgroup
parent, the CNI and containerd files, containerd (and the local pause image
imported), the kubelet, then kube-proxy once the nodes are Ready. It returns
when every kube-proxy is healthy. What ``down`` adds for container nodes is
their kind's ``stop`` (``kind``).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from kmm.sandbox import errors, health, nodekinds, ports, processes
from kmm.sandbox.containernodes import cgroups, configs, fakemodules, nodes
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes

__all__ = ["import_image", "plan", "start", "wait_socket"]


def plan(
    directory: Path,
    index: int,
    name: str,
    cgroup_parent: str,
    free: list[int],
    *,
    fake_modules: tuple[fakemodules.FakeModule, ...] = (),
) -> nodes.ContainerNode:
    """Container node ``index``'s files and host ports (three ``free`` ones:
    the kubelet's, its healthz and kube-proxy's health), recorded in its
    directory, with the fake modules' devices laid out."""
    port, healthz_port, proxy_port = free
    node = nodes.ContainerNode(
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
    nodes.save(node)
    return node


def import_image(ctr: Path, node: nodes.ContainerNode, archive: Path) -> None:
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


async def wait_socket(process: processes.Process, path: Path, *, timeout: float) -> None:
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
    starting: nodekinds.Starting,
    planned: list[nodes.ContainerNode],
    *,
    pinned: Path,
    pause_archive: Path,
    labels: dict[str, str],
) -> None:
    """Start the planned container nodes in their holders' namespaces (see
    the module docstring)."""
    if not pause_archive.is_file():
        raise errors.SandboxError(
            f"container nodes need the pause image archive {pause_archive} "
            "(`make test-images` writes build/images/pause.tar)"
        )
    binaries, launcher, timeout = starting.binaries, starting.launcher, starting.timeout
    kubelets: list[processes.Process] = []
    for node in planned:
        holder = starting.holder(node.name)
        cgroups.create_cgroups(node.cgroup_root)
        configs.write_cni_files(node, dict(binaries))
        configs.write_containerd_files(
            node, runc=binaries["runc"], ca_cert=starting.credentials.ca_cert
        )
        containerd = launcher.launch(
            f"containerd/{node.name}",
            configs.containerd_argv(holder, binaries["containerd"], node, pinned),
            health_url="",
        )
        await wait_socket(containerd, node.containerd_socket, timeout=timeout)
        await asyncio.to_thread(import_image, binaries["ctr"], node, pause_archive)
        # Its server, https://127.0.0.1:P, is the relay in the node's namespace.
        kubeconfig = starting.kubeconfig_for(
            kubeletnodes.identity(node.name), node.directory / "kubeconfig"
        )
        kubelets.append(
            launcher.launch(
                f"kubelet/{node.name}",
                configs.kubelet_argv(
                    holder,
                    binaries["kubelet"],
                    node,
                    kubeconfig=kubeconfig,
                    config=configs.write_kubelet_config(
                        node,
                        ca_cert=starting.credentials.ca_cert,
                        feature_gates=starting.kubelet_feature_gates,
                    ),
                    labels=labels,
                ),
                health_url=node.kubelet.health_url,
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=timeout) for p in kubelets))
    await nodekinds.wait_kubelets_ready(
        starting.record, [node.name for node in planned], timeout=timeout, log=kubelets[0].log
    )
    proxies = []
    for node in planned:
        kubeconfig = starting.kubeconfig_for(
            nodes.proxy_identity(node.name), node.directory / "kube-proxy.kubeconfig"
        )
        proxies.append(
            launcher.launch(
                f"kube-proxy/{node.name}",
                configs.kube_proxy_argv(
                    starting.holder(node.name),
                    binaries["kube-proxy"],
                    node,
                    kubeconfig=kubeconfig,
                ),
                health_url=f"http://{ports.HOST}:{node.proxy_healthz_port}/healthz",
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=timeout) for p in proxies))
