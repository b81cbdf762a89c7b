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

__all__ = ["ALL", "ETCD", "KUBERNETES", "KWOK", "GoTool", "tools_dir"]


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
        """Version plus a digest of go.mod and go.sum: a dependency change rebuilds."""
        digest = hashlib.sha256()
        for name in ("go.mod", "go.sum"):
            digest.update((self.directory / name).read_bytes())
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

ALL = (ETCD, KUBERNETES, KWOK)
