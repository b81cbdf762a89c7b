"""One container node: its files, ports and record, and its mount namespace.

Node ``i`` lives in ``<sandbox>/kubelets/<i>/`` (its kubelet's files as a
``kubeletnodes.nodes.KubeletNode``, its own ``root/``), recorded in
``node.json``. Inside its holder's mount namespace the fixed paths a node's
software uses (``MOUNTED``) are bind mounts of the node's own ``root/``
directories, and where a mount point is missing on the host the nearest
existing directory is covered by an overlay whose upper layer lies in the
node's directory (see the package docstring).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from kmm.sandbox import addressing, errors, namespaces, pki
from kmm.sandbox.containernodes import fakemodules
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes

__all__ = [
    "MOUNTED",
    "PAUSE_IMAGE",
    "RUNTIME",
    "ContainerNode",
    "MountPlan",
    "check_directory",
    "load",
    "mount_in",
    "mount_plan",
    "mount_script",
    "overlay_roots",
    "proxy_identity",
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
