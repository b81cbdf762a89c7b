"""What the sandbox runs and where each binary comes from.

Each component is built from a Go package in one of the pinned tools modules
under ``gotools/``; the version is read from that module's ``go.mod`` so the pin
lives in exactly one place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from importlib import resources
from pathlib import Path

__all__ = [
    "ALL",
    "DRA_TEST_DRIVER",
    "ETCD",
    "HELM",
    "KUBECTL",
    "KUBELET",
    "KUBERNETES",
    "KWOK",
    "PEERS",
    "REGISTRY",
    "GoTool",
    "tools_dir",
]

# Packages holding the version variables the Kubernetes build stamps
# (hack/lib/version.sh): what /version and nodeInfo.kubeletVersion report.
KUBERNETES_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
# The commit each pinned Kubernetes release was tagged at, stamped as
# gitCommit. The module proxy's origin record says it too, but not every
# proxy serves that record (the one of 2026-12-01's test machine did not), and
# without it the binaries report "$Format:%H$". Corroborated by the release's
# own /version: gitCommit with buildDate 2026-04-15T18:01:23Z, one second
# after the module's publication time.
KUBERNETES_COMMITS = {"v1.35.4": "7b8c6cf0edd376b3d7c2f255142977c7f93db258"}
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
    def commit(self) -> str:
        """The pinned Kubernetes release's commit, if known ("" otherwise)."""
        return KUBERNETES_COMMITS.get(self.version, "") if self.version_packages else ""

    @property
    def cache_key(self) -> str:
        """Version plus a digest of the module's files (go.mod, go.sum, its own
        Go sources), of the commit stamped and of the build recipe: any change
        rebuilds."""
        digest = hashlib.sha256(_RECIPE.encode())
        digest.update(self.commit.encode())
        for path in [
            self.directory / "go.mod",
            self.directory / "go.sum",
            *sorted(self.directory.rglob("*.go")),
        ]:
            digest.update(str(path.relative_to(self.directory)).encode())
            digest.update(path.read_bytes())
        for _, package in self.packages:
            digest.update(package.encode())
        return f"{self.name}-{self.version}-{digest.hexdigest()[:12]}"

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(binary for binary, _ in self.packages)


KUBERNETES = GoTool(
    name="kubernetes",
    directory=tools_dir() / "kubernetes",
    required_module="k8s.io/kubernetes",
    packages=(
        ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
        ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
        ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    ),
    version_packages=KUBERNETES_VERSION_PACKAGES,
)
# Built only for sandboxes with kubelet nodes: the kubelet of the same pin,
# and the fake CRI runtime it runs on (``fakecri/`` in the same module).
KUBELET = GoTool(
    name="kubelet",
    directory=tools_dir() / "kubernetes",
    required_module="k8s.io/kubernetes",
    packages=(
        ("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
        ("kmm-fake-cri", "kmm.local/sandbox/kubernetes/fakecri"),
    ),
    version_packages=KUBERNETES_VERSION_PACKAGES,
)
# Not part of a sandbox: the Kubernetes project's own DRA test driver (its
# kubelet-plugin subcommand), a second, independent driver that `kmm kubelet`
# is checked with.
DRA_TEST_DRIVER = GoTool(
    name="dra-test-driver",
    directory=tools_dir() / "kubernetes",
    required_module="k8s.io/kubernetes",
    packages=(("dra-test-driver", "k8s.io/kubernetes/test/e2e/dra/test-driver"),),
    version_packages=KUBERNETES_VERSION_PACKAGES,
)
# Not part of a sandbox: the kubectl of the same pin, inside the supported
# version skew whatever kubectl the machine has (kubectl is supported within
# one minor version of the API server).
KUBECTL = GoTool(
    name="kubectl",
    directory=tools_dir() / "kubernetes",
    required_module="k8s.io/kubernetes",
    packages=(("kubectl", "k8s.io/kubernetes/cmd/kubectl"),),
    version_packages=KUBERNETES_VERSION_PACKAGES,
)
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

ALL = (ETCD, KUBERNETES, KWOK)
# Programs kmm is tested against, built like the sandbox's binaries.
PEERS = (DRA_TEST_DRIVER,)

# The CNCF distribution registry the sandbox serves images from (``registry``).
REGISTRY = GoTool(
    name="registry",
    directory=tools_dir() / "registry",
    required_module="github.com/distribution/distribution/v3",
    packages=(("registry", "github.com/distribution/distribution/v3/cmd/registry"),),
)
