"""What a container node runs, configured: containerd, CNI, the kubelet, kube-proxy.

Configuration files (written into the node's own ``root/``, which its mount
namespace shows at the usual paths) and command lines (each in the node's
namespaces, ``namespaces.nsenter``). containerd names nothing outside: the
sandbox registry with the sandbox CA, and for every other registry a
loopback port nothing listens on; its pause image is a local one
(``nodes.PAUSE_IMAGE``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import addressing, building, namespaces
from kmm.sandbox.containernodes import nodes
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes

__all__ = [
    "CNI_PLUGINS",
    "cni_config",
    "cni_conflist",
    "containerd_argv",
    "containerd_config",
    "containerd_toml",
    "hosts_files",
    "kube_proxy_argv",
    "kube_proxy_config",
    "kube_proxy_document",
    "kubelet_argv",
    "kubelet_config",
    "write_cni_files",
    "write_containerd_files",
    "write_kubelet_config",
]

CNI_PLUGINS: Final = ("bridge", "host-local", "loopback", "portmap")
# The registry hosts.toml's loopback port nothing listens on (tcpmux, port 1):
# a pull naming any registry but the sandbox's is refused at once.
_NOWHERE: Final = "https://127.0.0.1:1"


# --- containerd --------------------------------------------------------------


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, numbers, booleans and arrays are TOML's."""
    return json.dumps(value)


def containerd_config(node: nodes.ContainerNode, *, runc: Path) -> str:
    """containerd's config (version 3): overlayfs, the node's registry hosts
    (for the CRI's pulls and the transfer service's), CDI (always on in 2.x)
    from the node's /var/run/cdi, the pinned runc, the local pause image."""
    return containerd_toml(
        socket=str(node.containerd_socket),
        opt=str(node.root / "opt" / "containerd"),
        runc=str(runc),
        systemd_cgroup=False,
        # Never below containerd's own score: the kubelet asks -998 for pod
        # sandboxes, which needs CAP_SYS_RESOURCE (not every machine grants
        # it), and sandbox pods are no more precious than the host's processes.
        restrict_oom_score_adj=True,
    )


def containerd_toml(
    *, socket: str, opt: str, runc: str, systemd_cgroup: bool, restrict_oom_score_adj: bool
) -> str:
    """containerd's config at the usual paths of a node's filesystem, with
    its socket, opt directory and runc where the node has them, cgroups
    through systemd or not: a container node's (``containerd_config``), a
    VM node's (``vmnodes.kubernetes``)."""
    cri_runtime = '[plugins."io.containerd.cri.v1.runtime"]'
    runc_table = '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]'
    images = '[plugins."io.containerd.cri.v1.images"]'
    lines = [
        "version = 3",
        f"root = {_toml('/var/lib/containerd')}",
        f"state = {_toml('/run/containerd')}",
        # Nothing containerd need not run: fewer plugins, nothing that listens.
        "disabled_plugins = "
        + _toml(
            [
                "io.containerd.nri.v1.nri",
                "io.containerd.tracing.processor.v1.otlp",
                "io.containerd.internal.v1.tracing",
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.blockfile",
                "io.containerd.snapshotter.v1.erofs",
                "io.containerd.snapshotter.v1.aufs",
                "io.containerd.image-verifier.v1.bindir",
            ]
        ),
        "[grpc]",
        f"address = {_toml(socket)}",
        "[ttrpc]",
        f"address = {_toml(socket + '.ttrpc')}",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"path = {_toml(opt)}",
        images,
        'snapshotter = "overlayfs"',
        f"{images[:-1]}.pinned_images]",
        f"sandbox = {_toml(nodes.PAUSE_IMAGE)}",
        f"{images[:-1]}.registry]",
        f"config_path = {_toml('/etc/containerd/certs.d')}",
        cri_runtime,
        f"cdi_spec_dirs = {_toml(['/var/run/cdi'])}",
        "netns_mounts_under_state_dir = true",
        f"restrict_oom_score_adj = {_toml(restrict_oom_score_adj)}",
        f"{cri_runtime[:-1]}.containerd]",
        'default_runtime_name = "runc"',
        runc_table,
        'runtime_type = "io.containerd.runc.v2"',
        f"{runc_table[:-1]}.options]",
        f"BinaryName = {_toml(runc)}",
        f"SystemdCgroup = {_toml(systemd_cgroup)}",
        f"{cri_runtime[:-1]}.cni]",
        f"bin_dirs = {_toml(['/opt/cni/bin'])}",
        f"conf_dir = {_toml('/etc/cni/net.d')}",
        "max_conf_num = 1",
        '[plugins."io.containerd.transfer.v1.local"]',
        f"config_path = {_toml('/etc/containerd/certs.d')}",
    ]
    return "\n".join(lines) + "\n"


def hosts_files(*, ca_cert: Path) -> dict[str, str]:
    """``certs.d`` entries (directory name -> hosts.toml): the sandbox registry
    with the sandbox CA, and ``_default`` for every other registry, pointing
    at a loopback port nothing listens on."""
    registry = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
    return {
        registry: (
            f"server = {_toml(f'https://{registry}')}\n"
            f"[host.{_toml(f'https://{registry}')}]\n"
            'capabilities = ["pull", "resolve", "push"]\n'
            f"ca = {_toml(str(ca_cert))}\n"
        ),
        "_default": (
            f"server = {_toml(_NOWHERE)}\n"
            f"[host.{_toml(_NOWHERE)}]\n"
            'capabilities = ["pull", "resolve"]\n'
        ),
    }


def write_containerd_files(node: nodes.ContainerNode, *, runc: Path, ca_cert: Path) -> Path:
    """config.toml and certs.d under the node's /etc/containerd; the config's path."""
    etc = node.source("/etc/containerd")
    for name, text in hosts_files(ca_cert=ca_cert).items():
        (etc / "certs.d" / name).mkdir(parents=True, exist_ok=True)
        (etc / "certs.d" / name / "hosts.toml").write_text(text)
    node.containerd_config.write_text(containerd_config(node, runc=runc))
    return node.containerd_config


def containerd_argv(
    holder: namespaces.Holder, containerd: Path, node: nodes.ContainerNode, pinned: Path
) -> list[str]:
    """containerd in the node's namespaces with the pinned directory first on
    its PATH (and so its shims' and runc's): an old containerd-shim or runc in
    /usr/bin is never the one found. ``env`` in the argv, not the launcher's
    environment, so a restart from the record gets the same PATH."""
    env = shutil.which("env") or "/usr/bin/env"
    return [
        *namespaces.nsenter(holder, mount=True),
        env,
        f"PATH={building.search_path(pinned)}",
        str(containerd),
        f"--config={node.containerd_config}",
    ]


# --- CNI ---------------------------------------------------------------------


def cni_config(node: nodes.ContainerNode) -> dict[str, Any]:
    """The node's conflist (``cni_conflist``)."""
    return cni_conflist(node.index)


def cni_conflist(index: int) -> dict[str, Any]:
    """Node ``index``'s conflist: a bridge with host-local addresses from its
    pod subnet and routes to the sandbox's networks only (no default route:
    nothing outside is reachable from a pod), and portmap."""
    subnet = addressing.pod_subnet(index)
    routes = [{"dst": str(net)} for net in addressing.sandbox_networks()]
    return {
        "cniVersion": "1.0.0",
        "name": "kmm-sandbox",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet)}]],
                    "routes": routes,
                    "dataDir": "/var/lib/containerd/cni-ipam",
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def write_cni_files(node: nodes.ContainerNode, binaries: dict[str, Path]) -> None:
    """The conflist in the node's /etc/cni/net.d; links to the pinned plugins
    in its /opt/cni/bin."""
    (node.source("/etc/cni/net.d") / "10-kmm-sandbox.conflist").write_text(
        json.dumps(cni_config(node), indent=2)
    )
    bin_dir = node.source("/opt/cni/bin")
    for plugin in CNI_PLUGINS:
        link = bin_dir / plugin
        link.unlink(missing_ok=True)
        link.symlink_to(binaries[plugin])


# --- kubelet and kube-proxy ----------------------------------------------------


def kubelet_config(
    node: nodes.ContainerNode, *, ca_cert: Path, feature_gates: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """The fake-runtime node's KubeletConfiguration, changed for containerd:
    its socket, cgroups under the sandbox's parent (QOS cgroups on: they work
    on v1 hybrid hosts with cgroupfs, and pods get the limits a cluster gives
    them), listening on the node's namespace, a resolv.conf naming nothing."""
    path = kubeletnodes.write_config(node.kubelet, ca_cert=ca_cert, feature_gates=feature_gates)
    config: dict[str, Any] = json.loads(path.read_text())
    resolv = node.directory / "resolv.conf"
    resolv.write_text("# kmm sandbox: no name server (nothing outside is reachable)\n")
    config.update(
        {
            "address": "0.0.0.0",
            "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
            "imageServiceEndpoint": f"unix://{node.containerd_socket}",
            "podLogsDir": "/var/log/pods",
            "cgroupRoot": node.cgroup_root,
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "makeIPTablesUtilChains": True,
            "resolvConf": str(resolv),
            "localStorageCapacityIsolation": True,
        }
    )
    return config


def write_kubelet_config(
    node: nodes.ContainerNode, *, ca_cert: Path, feature_gates: Mapping[str, bool] | None = None
) -> Path:
    path = node.directory / "kubelet-config.yaml"
    config = kubelet_config(node, ca_cert=ca_cert, feature_gates=feature_gates)
    path.write_text(json.dumps(config, indent=2))
    return path


def kubelet_argv(
    holder: namespaces.Holder,
    kubelet: Path,
    node: nodes.ContainerNode,
    *,
    kubeconfig: Path,
    config: Path,
    labels: dict[str, str],
) -> list[str]:
    return [
        *namespaces.nsenter(holder, mount=True),
        str(kubelet),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--root-dir=/var/lib/kubelet",
        "--cert-dir=/var/lib/kubelet/pki",
        f"--hostname-override={node.name}",
        f"--node-ip={node.address}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "--v=2",
    ]


def kube_proxy_config(node: nodes.ContainerNode, *, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode in the node's namespace. Zero conntrack
    limits and timeouts: it would otherwise write the host's global
    nf_conntrack_max and TCP timeouts."""
    return kube_proxy_document(
        name=node.name,
        kubeconfig=str(kubeconfig),
        healthz=f"127.0.0.1:{node.proxy_healthz_port}",
        address=node.address,
    )


def kube_proxy_document(
    *, name: str, kubeconfig: str, healthz: str, address: str
) -> dict[str, Any]:
    """kube-proxy in iptables mode for node ``name`` at ``address``, its
    health served on ``healthz`` (host:port), its conntrack settings left as
    the kernel has them (``kube_proxy_config`` says why)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": name,
        "mode": "iptables",
        "clusterCIDR": str(addressing.POD_NETWORK),
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": healthz,
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{address}/32"],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }


def kube_proxy_argv(
    holder: namespaces.Holder, kube_proxy: Path, node: nodes.ContainerNode, *, kubeconfig: Path
) -> list[str]:
    path = node.directory / "kube-proxy-config.yaml"
    path.write_text(json.dumps(kube_proxy_config(node, kubeconfig=kubeconfig), indent=2))
    return [
        *namespaces.nsenter(holder, mount=True),
        str(kube_proxy),
        f"--config={path}",
        "--v=2",
    ]
