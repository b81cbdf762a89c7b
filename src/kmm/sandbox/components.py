"""What the sandbox runs and where each binary comes from.

Each component is built from a Go package in one of the pinned tools modules
under ``gotools/``; the version is read from that module's ``go.mod`` so the pin
lives in exactly one place. A tool also says how it is built (build tags, cgo,
extra environment and linker flags, the C libraries cgo needs, the variables
stamped with its version); all of it is part of its cache key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from importlib import resources
from pathlib import Path

from kmm.sandbox import kubereleases

__all__ = [
    "ALL",
    "CNI_PLUGINS",
    "CONTAINERD",
    "CONTAINER_NODE",
    "DRA_TEST_DRIVER",
    "ETCD",
    "HELM",
    "KUBECTL",
    "KUBELET",
    "KUBERNETES",
    "KUBE_PROXY",
    "KWOK",
    "PEERS",
    "REGISTRY",
    "RUNC",
    "GoTool",
    "KubernetesTools",
    "container_node",
    "kubernetes",
    "tools_dir",
]

# Packages holding the version variables the Kubernetes build stamps
# (hack/lib/version.sh): what /version and nodeInfo.kubeletVersion report.
KUBERNETES_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
# Bumped when the way binaries are built changes (a new cache entry).
_RECIPE = "2"


def tools_dir() -> Path:
    """The directory holding the pinned Go tools modules."""
    return Path(str(resources.files("kmm.sandbox").joinpath("gotools")))


@dataclasses.dataclass(frozen=True)
class GoTool:
    """A set of binaries built from one pinned Go module."""

    name: str
    directory: Path
    required_module: str
    packages: tuple[tuple[str, str], ...]  # (binary name, Go package path)
    # Packages whose Kubernetes version variables the build sets (-X) from
    # the required module's version and origin; empty for non-Kubernetes tools.
    version_packages: tuple[str, ...] = ()
    # A Go string variable the build sets (-X) to the pinned version, for
    # tools that stamp only their version (Helm's ``internal/version``).
    version_variable: str = ""
    # Go string variables the build sets (-X), each to a template where
    # ``{version}`` is the pinned version (v1.2.3) and ``{number}`` the same
    # without its "v": what the project's own release build stamps.
    stamps: tuple[tuple[str, str], ...] = ()
    # Build tags (``go build -tags``).
    tags: tuple[str, ...] = ()
    # CGO_ENABLED: True or False, or None for Go's default on this machine
    # (how the first sandbox tools were built, and keep being built).
    cgo: bool | None = None
    # Further environment of ``go build`` (NAME, value).
    env: tuple[tuple[str, str], ...] = ()
    # Further linker flags (``-ldflags``), e.g. a static link of a cgo binary.
    ldflags: tuple[str, ...] = ()
    # C libraries cgo needs: (pkg-config name, Debian package with its headers),
    # checked before building so a missing one is named, not a compiler error.
    c_libraries: tuple[tuple[str, str], ...] = ()
    # Further directories whose files are part of the build (a local module
    # the tool's module replaces a requirement with): digested into the key.
    local_modules: tuple[Path, ...] = ()
    # The commit a Kubernetes release's tag points at ("" when not known:
    # kubereleases), stamped as gitCommit.
    commit: str = ""

    @property
    def version(self) -> str:
        """The pinned version of the module the binaries come from."""
        go_mod = (self.directory / "go.mod").read_text()
        if re.search(rf"^module\s+{re.escape(self.required_module)}\s*$", go_mod, re.M):
            return "local"  # the binaries come from the module itself, not a dependency
        match = re.search(rf"^require\s+{re.escape(self.required_module)}\s+(\S+)", go_mod, re.M)
        if match is None:
            match = re.search(rf"^\s+{re.escape(self.required_module)}\s+(\S+)", go_mod, re.M)
        if match is None:
            raise RuntimeError(f"{self.directory}/go.mod does not require {self.required_module}")
        return match.group(1)

    @property
    def cache_key(self) -> str:
        """Version plus a digest of the module's files (go.mod, go.sum, its own
        Go sources), of the commit stamped and of the build recipe: any change
        rebuilds."""
        digest = hashlib.sha256(_RECIPE.encode())
        digest.update(self.commit.encode())
        for root in (self.directory, *self.local_modules):
            for path in [root / "go.mod", root / "go.sum", *sorted(root.rglob("*.go"))]:
                if path.exists():
                    # Paths relative to the module itself (as keys always
                    # were), a local module's under its own directory name.
                    where = path.relative_to(root)
                    digest.update(
                        str(where if root == self.directory else root.name / where).encode()
                    )
                    digest.update(path.read_bytes())
        for _, package in self.packages:
            digest.update(package.encode())
        settings = self.build_settings
        if settings:  # only when set: the keys of tools without any stay as they were
            digest.update(json.dumps(settings, sort_keys=True).encode())
        return f"{self.name}-{self.version}-{digest.hexdigest()[:12]}"

    @property
    def build_settings(self) -> dict[str, object]:
        """How the binaries are built beyond the module's files: the fields set
        away from their defaults (what the cache key digests)."""
        settings: dict[str, object] = {
            "stamps": [list(stamp) for stamp in self.stamps],
            "tags": list(self.tags),
            "cgo": self.cgo,
            "env": [list(pair) for pair in self.env],
            "ldflags": list(self.ldflags),
            "c_libraries": [list(library) for library in self.c_libraries],
        }
        return {name: value for name, value in settings.items() if value not in ([], None)}

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(binary for binary, _ in self.packages)


@dataclasses.dataclass(frozen=True)
class KubernetesTools:
    """The binaries built from one release's wrapper module
    (``gotools/kubernetes/v<minor>``, ``kubereleases``)."""

    release: kubereleases.Release
    # The control plane every sandbox runs.
    control_plane: GoTool
    # Built only for sandboxes with kubelet nodes: the kubelet, and the fake
    # CRI runtime of the fake-runtime nodes (``gotools/fakecri``, a local
    # module each wrapper builds with its release's CRI packages).
    kubelet: GoTool
    # The kube-proxy of container and VM nodes (static: the node image
    # carries it).
    kube_proxy: GoTool
    # Not part of a sandbox: the kubectl of the release, inside the supported
    # version skew whatever kubectl the machine has (kubectl is supported
    # within one minor version of the API server).
    kubectl: GoTool
    # Not part of a sandbox: the Kubernetes project's own DRA test driver
    # (its kubelet-plugin subcommand), a second, independent driver that
    # `kmm kubelet` is checked with.
    dra_test_driver: GoTool


def kubernetes(release: kubereleases.Release = kubereleases.DEFAULT) -> KubernetesTools:
    """The Kubernetes binaries of ``release`` (the default one unless told)."""
    directory = tools_dir() / "kubernetes" / release.directory_name

    def tool(
        name: str,
        packages: tuple[tuple[str, str], ...],
        *,
        cgo: bool | None = None,
        local_modules: tuple[Path, ...] = (),
    ) -> GoTool:
        return GoTool(
            name=name,
            directory=directory,
            required_module="k8s.io/kubernetes",
            packages=packages,
            version_packages=KUBERNETES_VERSION_PACKAGES,
            commit=release.commit,
            cgo=cgo,
            local_modules=local_modules,
        )

    return KubernetesTools(
        release=release,
        control_plane=tool(
            "kubernetes",
            (
                ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
                ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
                ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
            ),
        ),
        kubelet=tool(
            "kubelet",
            (
                ("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
                ("kmm-fake-cri", "kmm.local/sandbox/fakecri"),
            ),
            local_modules=(tools_dir() / "fakecri",),
        ),
        kube_proxy=tool(
            "kube-proxy", (("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"),), cgo=False
        ),
        kubectl=tool("kubectl", (("kubectl", "k8s.io/kubernetes/cmd/kubectl"),)),
        dra_test_driver=tool(
            "dra-test-driver",
            (("dra-test-driver", "k8s.io/kubernetes/test/e2e/dra/test-driver"),),
        ),
    )


# The default release's, which everything but `kmm sandbox up
# --kubernetes-version` and `make test-compat` runs.
_DEFAULT = kubernetes()
KUBERNETES = _DEFAULT.control_plane
KUBELET = _DEFAULT.kubelet
DRA_TEST_DRIVER = _DEFAULT.dra_test_driver
KUBECTL = _DEFAULT.kubectl
ETCD = GoTool(
    name="etcd",
    directory=tools_dir() / "etcd",
    required_module="go.etcd.io/etcd/server/v3",
    packages=(("etcd", "go.etcd.io/etcd/server/v3"),),
)
KWOK = GoTool(
    name="kwok",
    directory=tools_dir() / "kwok",
    required_module="sigs.k8s.io/kwok",
    packages=(("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
)

# Helm, which the chart under deploy/helm is linted, rendered and installed
# with; its own module, since its client libraries follow Helm, not the pin.
HELM = GoTool(
    name="helm",
    directory=tools_dir() / "helm",
    required_module="helm.sh/helm/v3",
    packages=(("helm", "helm.sh/helm/v3/cmd/helm"),),
    version_variable="helm.sh/helm/v3/internal/version.version",
)

# The sandbox's container nodes (kubelet nodes on containerd): containerd, the
# shim it starts containers through and ctr (which imports the local pause
# image); runc; the CNI plugins that wire pods; the kube-proxy of the pin.
# Static (CGO_ENABLED=0) but runc, which needs libseccomp through cgo so that
# RuntimeDefault seccomp profiles apply; linked statically all the same.
# Debian's own containerd and runc may sit in /usr/bin: whatever starts these
# finds them through building.pinned_dir, first on PATH, never by name alone.
CONTAINERD = GoTool(
    name="containerd",
    directory=tools_dir() / "containerd",
    required_module="github.com/containerd/containerd/v2",
    packages=(
        ("containerd", "github.com/containerd/containerd/v2/cmd/containerd"),
        (
            "containerd-shim-runc-v2",
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        ),
        ("ctr", "github.com/containerd/containerd/v2/cmd/ctr"),
    ),
    stamps=(("github.com/containerd/containerd/v2/version.Version", "{version}"),),
    tags=("no_btrfs",),
    cgo=False,
)
# runc embeds its own VERSION file: nothing to stamp. The tags are its
# Makefile's static build's, without libpathrs (a Rust library Debian lacks;
# runc falls back to its Go implementation).
RUNC = GoTool(
    name="runc",
    directory=tools_dir() / "runc",
    required_module="github.com/opencontainers/runc",
    packages=(("runc", "github.com/opencontainers/runc"),),
    tags=("seccomp", "urfave_cli_no_docs", "netgo", "osusergo"),
    cgo=True,
    ldflags=("-extldflags", "-static"),
    c_libraries=(("libseccomp", "libseccomp-dev"),),
)
CNI_PLUGINS = GoTool(
    name="cni-plugins",
    directory=tools_dir() / "cni",
    required_module="github.com/containernetworking/plugins",
    packages=(
        ("bridge", "github.com/containernetworking/plugins/plugins/main/bridge"),
        ("host-local", "github.com/containernetworking/plugins/plugins/ipam/host-local"),
        ("loopback", "github.com/containernetworking/plugins/plugins/main/loopback"),
        ("portmap", "github.com/containernetworking/plugins/plugins/meta/portmap"),
    ),
    stamps=(
        ("github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion", "{version}"),
    ),
    cgo=False,
)
KUBE_PROXY = _DEFAULT.kube_proxy
CONTAINER_NODE = (CONTAINERD, RUNC, CNI_PLUGINS, KUBE_PROXY)


def container_node(release: kubereleases.Release) -> tuple[GoTool, ...]:
    """What a container node of ``release`` runs: containerd, runc and the
    CNI plugins (one pin for every release) and the release's kube-proxy."""
    return (CONTAINERD, RUNC, CNI_PLUGINS, kubernetes(release).kube_proxy)


# The CNCF distribution registry the sandbox serves images from.
REGISTRY = GoTool(
    name="registry",
    directory=tools_dir() / "registry",
    required_module="github.com/distribution/distribution/v3",
    packages=(("registry", "github.com/distribution/distribution/v3/cmd/registry"),),
    stamps=(("github.com/distribution/distribution/v3/version.version", "{version}"),),
    cgo=False,
)

ALL = (ETCD, KUBERNETES, KWOK)
# Programs kmm is tested against, built like the sandbox's binaries.
PEERS = (DRA_TEST_DRIVER,)
