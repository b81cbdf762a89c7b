"""Real kubelet nodes: the pinned kubelet on a fake container runtime.

Each node is a kubelet built from the pinned Kubernetes module and
``kmm-fake-cri`` (``gotools/fakecri``): pods bound to it go
Running as far as the API can tell, nothing executes, and the kubelet's DRA
manager is the real one, so drivers (``kmm driver``, anyone's) are called the
way a cluster calls them.

Everything a node writes lives under ``<sandbox>/kubelets/<name>/``; its
``root/`` is the node's filesystem as a driver sees it
(``root/var/lib/kubelet``, ``root/var/run/cdi``), so ``kmm driver --root``
finds the plugin registry without links. What the kubelet would touch outside
it, and how that is prevented (each cost time when first tried):

- cgroup v1 hosts: ``failCgroupV1: false``; no QoS cgroups and no
  node-allocatable enforcement, so nothing is written under /sys/fs/cgroup;
- each node has a network and a mount namespace of its own, held by a
  process (``namespaces``; the holder is launched before the API server and
  outlives kubelet restarts, as a machine outlives its kubelet). In the
  mount namespace tmpfs covers /var/lib and /var/log and the two fixed host
  paths the kubelet uses whatever its flags say,
  ``/var/lib/kubelet/device-plugins`` and ``/var/log/containers``, are
  bind-mounted from the node's root (hence a sandbox dir for kubelet nodes
  may not lie under them);
- the network namespace is linked to the sandbox's fabric (``fabric``): the
  node IP is ``addressing.node_address(i)``, on the node's own interface, so
  nothing ever dials the host's interfaces. The kubelet serves on 0.0.0.0
  there; the sandbox's relay publishes its port and healthz port on the
  host's 127.0.0.1 (same numbers), and the API server reaches it through
  the relay's CONNECT proxy. Its kubeconfig's ``https://127.0.0.1:P`` is the
  relay in its own namespace, forwarding to the API server;
- iptables utility chains are off (nothing runs that would need them);
- the six sysctls the kubelet sets are the host's: ``hostsysctls`` records
  them before the first kubelet starts, and ``kmm sandbox down`` writes
  them back once no other sandbox's kubelets hold them.

The kubelet authenticates as ``system:node:<name>`` (group ``system:nodes``),
so the Node authorizer and NodeRestriction judge it as in a real cluster,
and authenticates and authorizes its own callers through the sandbox's API
server (never anonymously). The fake runtime stays in the host's namespaces:
it serves the kubelet on a unix socket (a file, reachable from any network
namespace) and its HTTP side on the host's loopback.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from kmm.sandbox import errors, kubeletconfigs, namespaces, pki

__all__ = [
    "NODE_PREFIX",
    "KubeletNode",
    "check_directory",
    "cri_argv",
    "identity",
    "kubelet_argv",
    "load",
    "mount_node_paths",
    "save",
    "write_config",
]

NODE_PREFIX: Final = "kmm-kubelet-"
# Host paths the kubelet uses whatever its flags say; covered in its namespace.
_COVERED: Final = (Path("/var/lib"), Path("/var/log"))


@dataclasses.dataclass(frozen=True)
class KubeletNode:
    """One kubelet node's name, files and ports."""

    name: str
    directory: Path
    port: int
    healthz_port: int
    cri_http_port: int

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var" / "lib" / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "var" / "run" / "cdi"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def cri_socket(self) -> Path:
        return self.directory / "cri.sock"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.healthz_port}/healthz"

    @property
    def cri_url(self) -> str:
        """The fake runtime's HTTP side: ``/healthz`` and ``/containers``."""
        return f"http://127.0.0.1:{self.cri_http_port}"

    def make_dirs(self) -> None:
        for path in (
            self.kubelet_dir / "device-plugins",
            self.kubelet_dir / "pki",
            self.registry_dir,
            self.kubelet_dir / "plugins",
            self.cdi_dir,
            self.root / "var" / "log" / "containers",
            self.root / "var" / "log" / "pods",
            self.directory / "container-logs",
        ):
            path.mkdir(parents=True, exist_ok=True)


def save(node: KubeletNode) -> None:
    document = {
        "name": node.name,
        "port": node.port,
        "healthzPort": node.healthz_port,
        "criHttpPort": node.cri_http_port,
    }
    (node.directory / "node.json").write_text(json.dumps(document, indent=2))


def load(directory: Path) -> KubeletNode:
    """The node ``save`` wrote in ``directory``."""
    document = json.loads((directory / "node.json").read_text())
    return KubeletNode(
        name=document["name"],
        directory=directory,
        port=int(document["port"]),
        healthz_port=int(document["healthzPort"]),
        cri_http_port=int(document["criHttpPort"]),
    )


def identity(name: str) -> pki.ClientIdentity:
    """The node's client identity, as the Node authorizer expects it."""
    return pki.ClientIdentity(f"node-{name}", f"system:node:{name}", ("system:nodes",))


# sockaddr_un.sun_path: 108 bytes with the terminating NUL.
_MAX_SOCKET_PATH = 107
# The longest socket the kubelet itself makes under a node (a 10-digit name).
# A driver's sockets there grow with its name: `kmm driver` says when one
# does not fit.
_LONGEST_SOCKETS = ("kubelets/00/root/var/lib/kubelet/pod-resources/0123456789",)


def check_directory(directory: Path) -> None:
    """Refuse a sandbox dir that the kubelet's private mounts would hide, or
    one too deep for the unix sockets the kubelet creates under it."""
    longest = max(len(str(directory / socket)) for socket in _LONGEST_SOCKETS)
    if longest > _MAX_SOCKET_PATH:
        raise errors.SandboxError(
            f"a sandbox with kubelet nodes needs a shorter directory than {directory}: "
            f"the kubelet's sockets under it would take up to {longest} "
            f"characters, unix sockets allow {_MAX_SOCKET_PATH} (try --dir /tmp/kmm)"
        )
    for covered in _COVERED:
        if directory == covered or covered in directory.parents:
            raise errors.SandboxError(
                f"a sandbox with kubelet nodes may not live under {covered} "
                f"(the kubelet runs with a private {covered}): {directory}"
            )


def write_config(
    node: KubeletNode, *, ca_cert: Path, feature_gates: Mapping[str, bool] | None = None
) -> Path:
    """The node's KubeletConfiguration (JSON is YAML), written to its directory."""
    # Inside the node's namespace: its fabric address (the API server's way
    # in) and its loopback (the relay's way in from the host).
    config = kubeletconfigs.base(
        port=node.port,
        healthz_address="127.0.0.1",
        healthz_port=node.healthz_port,
        client_ca=str(ca_cert),
        feature_gates=feature_gates,
    )
    config.update(
        {
            "containerRuntimeEndpoint": f"unix://{node.cri_socket}",
            "imageServiceEndpoint": f"unix://{node.cri_socket}",
            "podLogsDir": str(node.root / "var" / "log" / "pods"),
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "makeIPTablesUtilChains": False,
            "localStorageCapacityIsolation": False,
            "shutdownGracePeriod": "0s",
        }
    )
    path = node.directory / "kubelet-config.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def cri_argv(binary: Path, node: KubeletNode) -> list[str]:
    return [
        str(binary),
        f"--listen={node.cri_socket}",
        f"--http=127.0.0.1:{node.cri_http_port}",
        f"--logs={node.directory / 'container-logs'}",
    ]


def mount_node_paths(node: KubeletNode, holder: namespaces.Holder) -> None:
    """Make the fixed host paths the kubelet uses the node's own, in the
    holder's mount namespace (see the module docstring)."""
    script = [
        "set -e",
        "mount -t tmpfs -o mode=0755 kmm-sandbox /var/lib",
        "mkdir -p /var/lib/kubelet/device-plugins",
        "mount --bind "
        + shlex.quote(str(node.kubelet_dir / "device-plugins"))
        + " /var/lib/kubelet/device-plugins",
        "mount -t tmpfs -o mode=0755 kmm-sandbox /var/log",
        "mkdir -p /var/log/containers",
        "mount --bind "
        + shlex.quote(str(node.root / "var" / "log" / "containers"))
        + " /var/log/containers",
    ]
    namespaces.run_in(holder, ["sh", "-c", "; ".join(script)], mount=True)


def kubelet_argv(
    binary: Path,
    node: KubeletNode,
    *,
    holder: namespaces.Holder,
    kubeconfig: Path,
    config: Path,
    address: str,
    labels: dict[str, str],
) -> list[str]:
    """The kubelet in the node's network and mount namespaces (``holder``'s)."""
    return [
        *namespaces.nsenter(holder, mount=True),
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={node.kubelet_dir}",
        f"--cert-dir={node.kubelet_dir / 'pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={address}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "--v=2",
    ]
