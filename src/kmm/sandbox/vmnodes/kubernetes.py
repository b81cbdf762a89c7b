"""What makes a VM node a Kubernetes node: its files, carried on its ESP.

The image holds the binaries (the pinned kubelet, containerd, runc, CNI
plugins and kube-proxy) and their systemd units (``guest/kmm-*.service``),
which start only on a node whose ESP carries ``kubernetes.env``. ``files``
makes everything else, as ``esp.NodeSettings.files``: flat names, copied to
``/run/kmm/node/`` at every boot, each put where ``files.list`` says (NAME
TARGET MODE per line, ``guest/node-setup``):

- the sandbox CA's certificate (never its key, nor anything else of the
  sandbox's ``pki/``), and the node's kubelet and kube-proxy client
  certificates and keys;
- kubeconfigs naming the API server at the gateway's address on the fabric
  and the API server's port (inside a guest 127.0.0.1 is the guest's own;
  the relay serves the API server there, ``networking``);
- the kubelet's configuration: containerd's socket, cgroups through systemd
  (the guest's init, as kubeadm's nodes have them), its port on every
  address of the guest and its health on the node's (the relay dials both
  from the fabric), the sandbox's eviction and DNS settings;
- containerd's configuration (``containernodes.configs.containerd_toml`` at
  the usual paths) and registry hosts: the sandbox registry with the sandbox
  CA, every other registry a loopback port nothing listens on;
- the CNI conflist: the node's pod subnet (``containernodes.configs``);
- kube-proxy's configuration, its health on the node's address;
- the pause image archive (``containernodes.nodes.PAUSE_IMAGE``, what
  containerd's pinned sandbox image names), imported before the kubelet
  starts;
- ``kubernetes.env``: the three daemons' command lines.

The kubelet's state (``/var/lib/kubelet``) and containerd's images live on
the node's disk and outlive a reboot; ``/run`` does not.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import addressing, kubeconfigs, kubeletconfigs, kubereleases
from kmm.sandbox.containernodes import configs

__all__ = ["CONTAINERD_SOCKET", "NodeFiles", "files", "kubelet_config"]

CONTAINERD_SOCKET: Final = "/run/containerd/containerd.sock"
_PKI: Final = "/etc/kubernetes/pki"
_PAUSE_ARCHIVE: Final = "/run/kmm/node/pause.tar"


@dataclasses.dataclass(frozen=True)
class NodeFiles:
    """What one VM node's files are made from: its name and address, the
    API server's port, its kubelet's and kube-proxy's ports on the guest,
    its node labels, and the PEM files of its identities (the CA's
    certificate; the kubelet's and kube-proxy's certificates and keys)."""

    name: str
    index: int
    api_port: int
    kubelet_port: int
    healthz_port: int
    proxy_healthz_port: int
    labels: Mapping[str, str]
    ca_cert: bytes
    kubelet_cert: bytes
    kubelet_key: bytes
    proxy_cert: bytes
    proxy_key: bytes
    pause_archive: bytes

    @property
    def address(self) -> str:
        return str(addressing.node_address(self.index))


def kubelet_config(node: NodeFiles) -> dict[str, Any]:
    """The node's KubeletConfiguration (see the module docstring)."""
    config = kubeletconfigs.base(
        port=node.kubelet_port,
        healthz_address=node.address,
        healthz_port=node.healthz_port,
        client_ca=f"{_PKI}/ca.crt",
        # VM nodes run the default release only (options.check).
        feature_gates=kubereleases.DEFAULT.gates.kubelet,
    )
    config.update(
        {
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "cgroupDriver": "systemd",
            # No DNS serves the cluster's address (as on container nodes),
            # and the resolv.conf pods get names no server.
            "resolvConf": "/etc/kubernetes/resolv.conf",
        }
    )
    return config


def _kubeconfig(node: NodeFiles, identity: str) -> str:
    return kubeconfigs.render(
        server=f"https://{addressing.GATEWAY}:{node.api_port}",
        ca_cert=f"{_PKI}/ca.crt",
        client_cert=f"{_PKI}/{identity}.crt",
        client_key=f"{_PKI}/{identity}.key",
    )


def _environment(node: NodeFiles) -> str:
    """``kubernetes.env``: systemd's EnvironmentFile (one NAME=value a line,
    the value the rest of the line; the units split it into arguments)."""
    labels = ",".join(f"{key}={value}" for key, value in sorted(node.labels.items()))
    values = {
        "KMM_CONTAINERD_ARGS": "--config /etc/containerd/config.toml",
        "KMM_KUBELET_ARGS": " ".join(
            [
                "--config=/etc/kubernetes/kubelet-config.yaml",
                "--kubeconfig=/etc/kubernetes/kubelet.kubeconfig",
                f"--hostname-override={node.name}",
                f"--node-ip={node.address}",
                f"--node-labels={labels}",
                "--v=2",
            ]
        ),
        "KMM_KUBE_PROXY_ARGS": "--config=/etc/kubernetes/kube-proxy-config.yaml --v=2",
        "KMM_PAUSE_ARCHIVE": _PAUSE_ARCHIVE,
    }
    for name, value in values.items():
        if "\n" in value or "'" in value or '"' in value or "\\" in value:
            raise ValueError(f"{name} holds a character systemd's EnvironmentFile would read")
    return "".join(f"{name}={value}\n" for name, value in values.items())


def files(node: NodeFiles) -> dict[str, bytes]:
    """The node's files for ``esp.NodeSettings.files`` (see the module docstring)."""
    hosts = configs.hosts_files(ca_cert=Path(_PKI) / "ca.crt")
    registry = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
    containerd = configs.containerd_toml(
        socket=CONTAINERD_SOCKET,
        opt="/opt/containerd",
        runc="/usr/local/bin/runc",
        systemd_cgroup=True,
        # The guest is the node: its root may give pod sandboxes the score
        # the kubelet asks for, as on any node.
        restrict_oom_score_adj=False,
    )
    proxy = configs.kube_proxy_document(
        name=node.name,
        kubeconfig="/etc/kubernetes/kube-proxy.kubeconfig",
        healthz=f"{node.address}:{node.proxy_healthz_port}",
        address=node.address,
    )
    # name -> (content, where it goes, its mode); None: it stays in /run/kmm/node.
    laid_out: dict[str, tuple[bytes, str | None, str]] = {
        "ca.crt": (node.ca_cert, f"{_PKI}/ca.crt", "0644"),
        "kubelet.crt": (node.kubelet_cert, f"{_PKI}/kubelet.crt", "0644"),
        "kubelet.key": (node.kubelet_key, f"{_PKI}/kubelet.key", "0600"),
        "kube-proxy.crt": (node.proxy_cert, f"{_PKI}/kube-proxy.crt", "0644"),
        "kube-proxy.key": (node.proxy_key, f"{_PKI}/kube-proxy.key", "0600"),
        "kubelet.kubeconfig": (
            _kubeconfig(node, "kubelet").encode(),
            "/etc/kubernetes/kubelet.kubeconfig",
            "0600",
        ),
        "kube-proxy.kubeconfig": (
            _kubeconfig(node, "kube-proxy").encode(),
            "/etc/kubernetes/kube-proxy.kubeconfig",
            "0600",
        ),
        "kubelet-config.yaml": (
            json.dumps(kubelet_config(node), indent=2).encode(),
            "/etc/kubernetes/kubelet-config.yaml",
            "0644",
        ),
        "kube-proxy-config.yaml": (
            json.dumps(proxy, indent=2).encode(),
            "/etc/kubernetes/kube-proxy-config.yaml",
            "0644",
        ),
        "resolv.conf": (
            b"# kmm sandbox: no name server (nothing outside is reachable)\n",
            "/etc/kubernetes/resolv.conf",
            "0644",
        ),
        "containerd.toml": (containerd.encode(), "/etc/containerd/config.toml", "0644"),
        "registry-hosts.toml": (
            hosts[registry].encode(),
            f"/etc/containerd/certs.d/{registry}/hosts.toml",
            "0644",
        ),
        "default-hosts.toml": (
            hosts["_default"].encode(),
            "/etc/containerd/certs.d/_default/hosts.toml",
            "0644",
        ),
        "cni.conflist": (
            json.dumps(configs.cni_conflist(node.index), indent=2).encode(),
            "/etc/cni/net.d/10-kmm-sandbox.conflist",
            "0644",
        ),
        "pause.tar": (node.pause_archive, None, "0644"),
        "kubernetes.env": (_environment(node).encode(), None, "0644"),
    }
    listing = "".join(
        f"{name} {target} {mode}\n"
        for name, (_, target, mode) in laid_out.items()
        if target is not None
    )
    return {
        **{name: content for name, (content, _, _) in laid_out.items()},
        "files.list": listing.encode(),
    }
