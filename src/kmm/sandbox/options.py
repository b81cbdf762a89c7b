"""What ``kmm sandbox up`` is asked for: ``Options``, checked before anything starts.

``cluster`` re-exports ``Options`` (``cluster.up(cluster.Options(...))`` is the
sandbox's entry point); the flag names in ``check``'s messages are the CLI's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kmm.sandbox import addressing, kubereleases
from kmm.sandbox.containernodes import fakemodules
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.registry import Auth as RegistryAuth

__all__ = ["ACCELERATORS", "DEFAULT_KERNELS", "RUNTIMES", "Options"]

DEFAULT_KERNELS = ("6.8.0-45-generic",)
# What runs a kubelet node's pods: nothing (a fake CRI), or containerd and runc.
RUNTIMES = ("fake", containernodes.RUNTIME)
# What VM nodes run on (``vmnodes.accel``): KVM where it boots a node, else TCG.
ACCELERATORS = ("auto", "kvm", "tcg")


@dataclasses.dataclass(frozen=True)
class Options:
    """What ``up`` starts: where, with which binary cache, how many nodes of which kernels."""

    directory: Path
    cache_dir: Path
    nodes: int = 3
    kernels: tuple[str, ...] = DEFAULT_KERNELS
    apiserver_port: int = 0
    start_timeout: float = 180.0
    # kube-apiserver --runtime-config entries, e.g. "resource.k8s.io/v1=false"
    # for a cluster that does not serve DRA.
    runtime_config: tuple[str, ...] = ()
    # Nodes served by real kubelets on a fake container runtime (kubeletnodes),
    # or on containerd (runtime "containerd": containernodes).
    kubelet_nodes: int = 0
    runtime: str = "fake"
    # The pause image containerd's pod sandboxes run (`make test-images`).
    pause_image: Path = Path("build/images/pause.tar")
    # Seconds between the compactions the API server asks of etcd (its
    # --etcd-compaction-interval; None keeps its 5 minutes). A short one makes
    # a resourceVersion older than two intervals answer 410 Gone.
    etcd_compaction_interval: float | None = None
    # False: the API server's --watch-cache=false. Watches and lists then go
    # to etcd, so a watch from a resourceVersion compaction has passed is
    # answered 410 Gone (its watch cache would answer it from memory, and
    # expire it only when its own window of events moves on).
    watch_cache: bool = True
    # The API server's --max-requests-inflight / --max-mutating-requests-inflight
    # (None keeps its defaults). Setting either turns API Priority and Fairness
    # off, so the limit is the plain in-flight filter: a request past it is
    # answered 429 with Retry-After at once instead of waiting in an APF queue.
    # Members of system:masters (the sandbox's admin) are never throttled.
    max_requests_inflight: int | None = None
    max_mutating_requests_inflight: int | None = None
    # The image registry (``registry``): None leaves it to the default, on
    # when credentials are asked for (and, once the sandbox has container
    # nodes, when it has any); ``registry_auth`` turns htpasswd auth on.
    registry: bool | None = None
    registry_auth: RegistryAuth | None = None
    # Kernel modules every container node shows as loaded, with their devices
    # (``fakemodules``: the kernel here loads none).
    fake_modules: tuple[fakemodules.FakeModule, ...] = ()
    # VM nodes (``vmnodes``): qemu guests booting Debian's kernels, Secure
    # Boot on unless told otherwise, on ``node_kernel`` first ("": the
    # image's default), accelerated as ``accel`` says.
    vm_nodes: int = 0
    secure_boot: bool = True
    node_kernel: str = ""
    accel: str = "auto"
    # The Kubernetes release of the control plane and of every kubelet node
    # (``kubereleases``): "" the default, else a minor or its pinned patch.
    kubernetes_version: str = ""

    @property
    def release(self) -> kubereleases.Release:
        """The release ``kubernetes_version`` names (ValueError if none)."""
        return kubereleases.find(self.kubernetes_version)

    @property
    def containers(self) -> bool:
        """Whether the kubelet nodes run containerd (container nodes)."""
        return self.runtime == containernodes.RUNTIME

    @property
    def wants_registry(self) -> bool:
        if self.registry is not None:
            return self.registry
        return self.registry_auth is not None or self.containers or self.vm_nodes > 0

    def apiserver_flags(self) -> list[str]:
        """The kube-apiserver flags these options add."""
        flags = []
        if self.runtime_config:
            flags.append(f"--runtime-config={','.join(self.runtime_config)}")
        if self.etcd_compaction_interval is not None:
            # Go durations take a unit; milliseconds keep sub-second values.
            flags.append(
                f"--etcd-compaction-interval={round(self.etcd_compaction_interval * 1000)}ms"
            )
        if not self.watch_cache:
            flags.append("--watch-cache=false")
        limits = (
            ("max-requests-inflight", self.max_requests_inflight),
            ("max-mutating-requests-inflight", self.max_mutating_requests_inflight),
        )
        for flag, value in limits:
            if value is not None:
                flags.append(f"--{flag}={value}")
        if any(value is not None for _, value in limits):
            flags.append("--enable-priority-and-fairness=false")
        return flags

    def check(self) -> None:
        """ValueError naming the flag of the first option out of range."""
        if self.nodes < 0:
            raise ValueError("--nodes must be 0 or more")
        if self.kubelet_nodes < 0:
            raise ValueError("--kubelet-nodes must be 0 or more")
        if self.runtime not in RUNTIMES:
            raise ValueError(
                f"--runtime must be one of {', '.join(RUNTIMES)}, not {self.runtime!r}"
            )
        if self.runtime != "fake" and not self.kubelet_nodes:
            raise ValueError(f"--runtime {self.runtime} needs --kubelet-nodes 1 or more")
        if not self.kernels:
            raise ValueError("at least one --kernel is needed")
        if self.etcd_compaction_interval is not None and not self.etcd_compaction_interval > 0:
            raise ValueError("--etcd-compaction-interval must be more than 0 seconds")
        if self.registry is False and self.registry_auth is not None:
            raise ValueError("--registry-auth needs the registry: drop --no-registry")
        if self.fake_modules and not self.containers:
            raise ValueError(f"--fake-module needs --runtime {containernodes.RUNTIME}")
        fakemodules.check(self.fake_modules)
        for flag, value in (
            ("--max-requests-inflight", self.max_requests_inflight),
            ("--max-mutating-requests-inflight", self.max_mutating_requests_inflight),
        ):
            # 0 would lift the limit altogether once APF is off: not what a
            # user asking for a low limit means.
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be 1 or more")
        self._check_vm_nodes()
        release = self.release
        if self.vm_nodes and release != kubereleases.DEFAULT:
            raise ValueError(
                f"--kubernetes-version {self.kubernetes_version}: VM nodes run the node image's "
                f"kubelet, built for Kubernetes {kubereleases.DEFAULT.minor} only; drop "
                "--vm-nodes or the version"
            )
        if any(entry.startswith("resource.k8s.io/") for entry in self.runtime_config) and (
            self.kubelet_nodes or self.vm_nodes
        ):
            flag = "--kubelet-nodes" if self.kubelet_nodes else "--vm-nodes"
            raise ValueError(
                f"{flag} needs resource.k8s.io served: the Node authorizer and "
                "the kubelet's DRA manager watch it"
            )

    def _check_vm_nodes(self) -> None:
        if self.vm_nodes < 0:
            raise ValueError("--vm-nodes must be 0 or more")
        if self.accel not in ACCELERATORS:
            raise ValueError(
                f"--accel must be one of {', '.join(ACCELERATORS)}, not {self.accel!r}"
            )
        if not self.vm_nodes:
            for flag, given in (
                ("--node-kernel", bool(self.node_kernel)),
                ("--no-secure-boot", not self.secure_boot),
                (f"--accel {self.accel}", self.accel != "auto"),
            ):
                if given:
                    raise ValueError(f"{flag} needs --vm-nodes 1 or more")
        if self.kubelet_nodes + self.vm_nodes > addressing.MAX_NODES:
            raise ValueError(
                f"--kubelet-nodes and --vm-nodes together must be {addressing.MAX_NODES} or fewer"
            )
