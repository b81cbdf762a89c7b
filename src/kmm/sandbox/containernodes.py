"""Container nodes: the pinned kubelet on containerd and runc, pods in real containers.

Node ``i`` (``<sandbox>/kubelets/<i>/``) is one holder process owning a
network namespace and a private mount namespace (``networking`` starts it
and links it to the fabric before the API server starts); containerd, the
kubelet and kube-proxy join both (``nsenter``), and containerd's shims and
the containers' runc inherit them. Inside, the fixed paths a node's software uses
(``MOUNTED``) are bind mounts of the node's own ``root/`` directories, so a
pod's hostPath ``/var/lib/kubelet/plugins`` or ``/lib/firmware`` is the
node's, never the host's; the root is made private from the host first, then
rshared inside (mounts the kubelet makes reach containerd's containers).
Where a mount point is missing on the host, the nearest existing directory is
covered by an overlay whose upper layer lies in the node's directory, so the
host never gets a new directory either.

What keeps the host as it was (``down`` undoes the rest):
- containerd names nothing outside: its registry hosts say the sandbox
  registry (CA = the sandbox CA) and, for every other host, ``_default``
  points at a closed loopback port, so a pull of an outside image fails at
  once; the sandbox image (pause) is imported from a local archive;
- runc and the shim are the pinned binaries (runc by absolute path, the
  pinned directory first on PATH, never /usr/bin's);
- containers' cgroups live under ``/kmm-sandbox-<id>/<node>`` in every
  hierarchy (``cgroup_parent``), which ``remove_cgroups`` empties and removes;
- shims run in sessions of their own, outside the launcher's record:
  ``kill_shims`` finds them by the node's containerd address;
- kube-proxy leaves the host's global conntrack limits alone (zero
  ``maxPerCore`` and timeouts); its rules, like the CNI bridge's, live in
  the node's namespace and go with it.

Limits: cgroup v1 (hybrid) and v2 hosts as root; IPv4 only; no cluster DNS
(the kubelet's ``resolvConf`` names nothing, its ``clusterDNS`` is a
ClusterIP nothing serves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import shlex
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import addressing, building, errors, fakemodules, kubeletnodes, namespaces, pki

__all__ = [
    "MOUNTED",
    "PAUSE_IMAGE",
    "RUNTIME",
    "ContainerNode",
    "cgroup_hierarchies",
    "check_directory",
    "cni_config",
    "containerd_argv",
    "containerd_config",
    "create_cgroups",
    "hosts_files",
    "kill_shims",
    "kube_proxy_config",
    "kubelet_config",
    "load",
    "mount_in",
    "mount_plan",
    "mount_script",
    "overlay_roots",
    "proxy_identity",
    "remove_cgroups",
    "save",
]

RUNTIME: Final = "containerd"
# What containerd's pinned_images.sandbox names: imported at node start from
# the images step's archive (build/images/pause.tar), never pulled.
PAUSE_IMAGE: Final = "kmm.sandbox/pause:3.10"
# Paths a node's software uses whatever its flags say, each bind-mounted from
# the node's own root/ inside its mount namespace.
MOUNTED: Final = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/run/cdi",
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/lib/firmware",
    "/lib/modules",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/containerd",
)
CNI_PLUGINS: Final = ("bridge", "host-local", "loopback", "portmap")
# The registry hosts.toml's loopback port nothing listens on (tcpmux, port 1):
# a pull naming any registry but the sandbox's is refused at once.
_NOWHERE: Final = "https://127.0.0.1:1"
_CGROUP_ROOT: Final = Path("/sys/fs/cgroup")


@dataclasses.dataclass(frozen=True)
class ContainerNode:
    """One container node: its kubelet's files and ports, and what it runs beside."""

    kubelet: kubeletnodes.KubeletNode
    index: int
    proxy_healthz_port: int
    # /kmm-sandbox-<id>/<node>: the kubelet's cgroupRoot in every hierarchy.
    cgroup_root: str
    # Kernel modules the node shows as loaded, with their devices (``fakemodules``).
    fake_modules: tuple[fakemodules.FakeModule, ...] = ()

    @property
    def name(self) -> str:
        return self.kubelet.name

    @property
    def directory(self) -> Path:
        return self.kubelet.directory

    @property
    def root(self) -> Path:
        return self.kubelet.root

    @property
    def address(self) -> str:
        """The node IP, on its fabric link."""
        return str(addressing.node_address(self.index))

    @property
    def containerd_socket(self) -> Path:
        """containerd's address: a path of this node alone (shims carry it in
        their argv, which is how ``kill_shims`` tells them apart)."""
        return self.directory / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "etc" / "containerd" / "config.toml"

    def source(self, target: str) -> Path:
        """The node's own directory mounted over host path ``target``."""
        return self.root / target.lstrip("/")

    def make_dirs(self) -> None:
        self.kubelet.make_dirs()
        for target in MOUNTED:
            self.source(target).mkdir(parents=True, exist_ok=True)
        (self.directory / "overlay").mkdir(exist_ok=True)
        if self.fake_modules:
            fakemodules.lay_out(self.directory, self.fake_modules)


def save(node: ContainerNode) -> None:
    """node.json as ``kubeletnodes.load`` reads it, plus what is containerd's."""
    document = {
        "name": node.name,
        "runtime": RUNTIME,
        "index": node.index,
        "port": node.kubelet.port,
        "healthzPort": node.kubelet.healthz_port,
        "criHttpPort": 0,
        "proxyHealthzPort": node.proxy_healthz_port,
        "cgroupRoot": node.cgroup_root,
        "fakeModules": [[name, count] for name, count in node.fake_modules],
    }
    (node.directory / "node.json").write_text(json.dumps(document, indent=2))


def load(directory: Path) -> ContainerNode | None:
    """The container node ``save`` wrote in ``directory``; None for a fake-runtime node."""
    document = json.loads((directory / "node.json").read_text())
    if document.get("runtime") != RUNTIME:
        return None
    return ContainerNode(
        kubelet=kubeletnodes.load(directory),
        index=int(document["index"]),
        proxy_healthz_port=int(document["proxyHealthzPort"]),
        cgroup_root=str(document["cgroupRoot"]),
        fake_modules=tuple(
            (str(name), int(count)) for name, count in document.get("fakeModules", ())
        ),
    )


def proxy_identity(name: str) -> pki.ClientIdentity:
    """kube-proxy's client identity on node ``name``: a real cluster's
    ``system:node-proxier`` ClusterRole is bound to user ``system:kube-proxy``."""
    return pki.ClientIdentity(f"proxy-{name}", "system:kube-proxy")


# --- the mount namespace -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MountPlan:
    """What the holder does before it sleeps: overlays first (mount points
    that are missing on the host), then the binds."""

    overlays: tuple[str, ...]
    binds: tuple[tuple[Path, str], ...]  # (node's source, target)


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return Path(os.path.realpath(candidate))
    return Path("/")


def overlay_roots() -> tuple[str, ...]:
    """The host directories a node covers with an overlay: the nearest
    existing parent of each ``MOUNTED`` path missing on the host. SandboxError
    if a path's only existing ancestor is ``/`` (covering the root is not on
    offer)."""
    covered: set[Path] = set()
    for target in MOUNTED:
        if Path(target).is_dir():
            continue
        ancestor = _existing_ancestor(Path(target))
        if ancestor == Path("/"):
            raise errors.SandboxError(
                f"container nodes need {Path(target).parts[1]!r} below / on this host "
                f"(to mount the node's own {target} in it)"
            )
        covered.add(ancestor)
    # An overlay on a parent already lets its children be made.
    overlays = sorted(a for a in covered if not any(o in a.parents for o in covered))
    return tuple(str(o) for o in overlays)


def mount_plan(node: ContainerNode) -> MountPlan:
    """Binds for ``MOUNTED``, and the overlays (``overlay_roots``) that give
    missing mount points a place without creating them on the host."""
    binds = tuple((node.source(target), target) for target in MOUNTED)
    return MountPlan(overlays=overlay_roots(), binds=binds)


def check_directory(directory: Path, plan_overlays: Sequence[str] = ()) -> None:
    """Refuse a sandbox dir hidden by a node's mounts (writes to it would land
    in the node's namespace only)."""
    hidden = {Path(target) for target in MOUNTED} | {Path(o) for o in plan_overlays}
    # The deepest first, so the message names the mount that hides it
    # (/etc/containerd, not the /etc overlay made for it); a set's order
    # would change with the hash seed.
    for path in sorted(hidden, key=lambda found: (-len(found.parts), str(found))):
        if directory == path or path in directory.parents:
            raise errors.SandboxError(
                f"a sandbox with container nodes may not live under {path} "
                f"(each node mounts its own {path}): {directory}"
            )


def mount_script(node: ContainerNode, plan: MountPlan) -> str:
    """What makes the node's mounts in its holder's mount namespace (private
    from the host already): the overlays, the binds, then the root rshared
    inside, so mounts the kubelet makes reach containerd's containers."""
    overlay_dir = node.directory / "overlay"
    lines = ["set -e"]
    for number, lower in enumerate(plan.overlays):
        upper, work = overlay_dir / f"{number}-upper", overlay_dir / f"{number}-work"
        lines.append(f"mkdir -p {shlex.quote(str(upper))} {shlex.quote(str(work))}")
        lines.append(
            "mount -t overlay kmm-sandbox -o "
            + shlex.quote(f"lowerdir={lower},upperdir={upper},workdir={work}")
            + f" {shlex.quote(lower)}"
        )
    for source, target in plan.binds:
        lines.append(f"mkdir -p {shlex.quote(target)}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
    if node.fake_modules:
        lines.extend(fakemodules.mount_lines(node.directory))
    lines.append("mount --make-rshared /")
    return "\n".join(lines)


def mount_in(node: ContainerNode, holder: namespaces.Holder) -> None:
    """Make the node's mounts in ``holder``'s mount namespace."""
    plan = mount_plan(node)
    check_directory(node.directory.parent.parent, plan.overlays)
    namespaces.run_in(holder, ["sh", "-c", mount_script(node, plan)], mount=True)


# --- containerd --------------------------------------------------------------


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, numbers, booleans and arrays are TOML's."""
    return json.dumps(value)


def containerd_config(node: ContainerNode, *, runc: Path) -> str:
    """containerd's config (version 3): overlayfs, the node's registry hosts
    (for the CRI's pulls and the transfer service's), CDI (always on in 2.x)
    from the node's /var/run/cdi, the pinned runc, the local pause image."""
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
        f"address = {_toml(str(node.containerd_socket))}",
        "[ttrpc]",
        f"address = {_toml(str(node.containerd_socket) + '.ttrpc')}",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"path = {_toml(str(node.root / 'opt' / 'containerd'))}",
        images,
        'snapshotter = "overlayfs"',
        f"{images[:-1]}.pinned_images]",
        f"sandbox = {_toml(PAUSE_IMAGE)}",
        f"{images[:-1]}.registry]",
        f"config_path = {_toml('/etc/containerd/certs.d')}",
        cri_runtime,
        f"cdi_spec_dirs = {_toml(['/var/run/cdi'])}",
        "netns_mounts_under_state_dir = true",
        # Never below containerd's own score: the kubelet asks -998 for pod
        # sandboxes, which needs CAP_SYS_RESOURCE (not every machine grants
        # it), and sandbox pods are no more precious than the host's processes.
        "restrict_oom_score_adj = true",
        f"{cri_runtime[:-1]}.containerd]",
        'default_runtime_name = "runc"',
        runc_table,
        'runtime_type = "io.containerd.runc.v2"',
        f"{runc_table[:-1]}.options]",
        f"BinaryName = {_toml(str(runc))}",
        "SystemdCgroup = false",
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


def write_containerd_files(node: ContainerNode, *, runc: Path, ca_cert: Path) -> Path:
    """config.toml and certs.d under the node's /etc/containerd; the config's path."""
    etc = node.source("/etc/containerd")
    for name, text in hosts_files(ca_cert=ca_cert).items():
        (etc / "certs.d" / name).mkdir(parents=True, exist_ok=True)
        (etc / "certs.d" / name / "hosts.toml").write_text(text)
    node.containerd_config.write_text(containerd_config(node, runc=runc))
    return node.containerd_config


def containerd_argv(
    holder: namespaces.Holder, containerd: Path, node: ContainerNode, pinned: Path
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


def cni_config(node: ContainerNode) -> dict[str, Any]:
    """The node's conflist: a bridge with host-local addresses from the node's
    pod subnet and routes to the sandbox's networks only (no default route:
    nothing outside is reachable from a pod), and portmap."""
    subnet = addressing.pod_subnet(node.index)
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


def write_cni_files(node: ContainerNode, binaries: dict[str, Path]) -> None:
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


def kubelet_config(node: ContainerNode, *, ca_cert: Path) -> dict[str, Any]:
    """The fake-runtime node's KubeletConfiguration, changed for containerd:
    its socket, cgroups under the sandbox's parent (QOS cgroups on: they work
    on v1 hybrid hosts with cgroupfs, and pods get the limits a cluster gives
    them), listening on the node's namespace, a resolv.conf naming nothing."""
    path = kubeletnodes.write_config(node.kubelet, ca_cert=ca_cert)
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


def write_kubelet_config(node: ContainerNode, *, ca_cert: Path) -> Path:
    path = node.directory / "kubelet-config.yaml"
    path.write_text(json.dumps(kubelet_config(node, ca_cert=ca_cert), indent=2))
    return path


def kubelet_argv(
    holder: namespaces.Holder,
    kubelet: Path,
    node: ContainerNode,
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


def kube_proxy_config(node: ContainerNode, *, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode in the node's namespace. Zero conntrack
    limits and timeouts: it would otherwise write the host's global
    nf_conntrack_max and TCP timeouts."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": str(addressing.POD_NETWORK),
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{node.proxy_healthz_port}",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{node.address}/32"],
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
    holder: namespaces.Holder, kube_proxy: Path, node: ContainerNode, *, kubeconfig: Path
) -> list[str]:
    path = node.directory / "kube-proxy-config.yaml"
    path.write_text(json.dumps(kube_proxy_config(node, kubeconfig=kubeconfig), indent=2))
    return [
        *namespaces.nsenter(holder, mount=True),
        str(kube_proxy),
        f"--config={path}",
        "--v=2",
    ]


# --- cgroups and shims -----------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (each v1 controller's and the unified one)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            found.append(Path(fields[1]))
    return found


def create_cgroups(cgroup_root: str) -> None:
    """Make ``cgroup_root`` in every hierarchy (the kubelet requires it to
    exist); a new cpuset gets its parent's cpus and mems, without which no
    task may join it."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy
        for part in Path(cgroup_root).parts[1:]:
            parent, path = path, path / part
            if path.is_dir():
                continue
            path.mkdir()
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((parent / name).read_text())


def _walk_bottom_up(path: Path) -> Iterator[Path]:
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir():
                yield from _walk_bottom_up(child)
    yield path


def _kill_procs(cgroup: Path) -> int:
    killed = 0
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
    return killed


def remove_cgroups(parent: str, *, timeout: float = 10.0) -> list[Path]:
    """SIGKILL every process under ``parent`` and remove its cgroups in every
    hierarchy; the ones that would not go within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / parent.lstrip("/")
        if not top.is_dir():
            continue
        while True:
            remaining = []
            for cgroup in _walk_bottom_up(top):
                _kill_procs(cgroup)
                try:
                    cgroup.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    remaining.append(cgroup)
            if not remaining:
                break
            if time.monotonic() > deadline:
                left += remaining
                break
            time.sleep(0.05)
    return left


def kill_shims(address: Path, *, timeout: float = 10.0) -> list[int]:
    """SIGKILL the containerd shims started for containerd at ``address``
    (they leave its session and outlive it) and wait, up to ``timeout``
    seconds, until each has exited; their pids.

    The wait is what lets ``down`` promise that no shim outlives it: a
    SIGKILLed process still runs until the kernel has torn it down, which on
    a loaded machine is long enough to be seen."""
    killed: list[int] = []
    exits: list[int] = []  # pidfds: readable once the process has exited
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"containerd-shim-runc-v2"):
            continue
        flag = argv.index(b"-address") if b"-address" in argv else -1
        if 0 <= flag < len(argv) - 1 and argv[flag + 1] == str(address).encode():
            try:
                # Opened first, so the signal reaches this process and not a
                # later one given the same pid.
                pidfd = os.pidfd_open(int(entry.name))
            except ProcessLookupError:
                continue
            exits.append(pidfd)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(int(entry.name))
    deadline = time.monotonic() + timeout
    try:
        for pidfd in exits:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for pidfd in exits:
            os.close(pidfd)
    return killed
