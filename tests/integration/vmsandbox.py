"""The session's one sandbox with a VM node, shared by the tests that need a
real kernel (``test_vm_modules``, then ``test_vm_nodes``).

Started as a user starts it: ``kmm sandbox up --nodes 0 --kubelet-nodes 1
--runtime containerd --vm-nodes 1 --accel tcg``. The containerd node
(fabric index 0) is where build, sign and preflight pods run at the host's
speed; the VM node (fabric index 1: kubelet nodes come first) boots
Debian's signed kernel under Secure Boot, under TCG, and is where modules
load. kmm's image and the builder image are pushed once.

A VM node under TCG costs a minute or two to boot and minutes to pull a
large image, so one sandbox serves every such test. What each test owes the
next: the node on the kernel it booted first (``image.kernels.default``),
nothing of its own left in the cluster. ``test_vm_nodes`` sorts last and its
last test takes the sandbox down (the fixture's own ``down`` then finds
nothing to do).

Needs ``make vm-image vm-test-modules vm-toolkit-images test-images image``
first (no test downloads or builds an image) and the host-wide lock
(``/work/notes/nodes-lock``): the sandbox starts network namespaces and
keeps one core busy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import containersandbox

from kmm.cli import paths
from kmm.sandbox import addressing, cluster, state
from kmm.sandbox.vmnodes import firmware, images, kernels, toolkitimages
from kmm.sandbox.vmnodes import kind as vmkind
from kmm.sandbox.vmnodes import nodes as vm
from kmm.sandbox.vmnodes import planning as vmplanning

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "build" / "vm" / "modules"
EXAMPLE_MODULES = ROOT / "build" / "vm" / "examples" / "kmmdemo"
IMAGES = ROOT / "build" / "images"
KMM_IMAGE = ROOT / "build" / "kmm-image.tar"
BUILDER_IMAGE = ROOT / "build" / "kmm-builder-image.tar"
TEST_MODULE = "kmm_vm_test"
NODE = f"{vmkind.NODE_PREFIX}0"
BUILD_NODE = "kmm-kubelet-0"
#: Fabric index of the VM node: the kubelet nodes' come first.
NODE_INDEX = 1
NAMESPACE = "default"
WORKLOAD = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}/workload:1"
KMM = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}/kmm/kmm:example"
BUILDER = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}/kmm/builder:1"
#: The kmm command of this environment.
KMM_CLI = Path(sys.executable).with_name("kmm")
# A VM's start, and each reboot, under TCG on a busy 2-core machine.
UP_TIMEOUT = 1200.0
REBOOT_TIMEOUT = 540.0


@dataclasses.dataclass(frozen=True)
class Started:
    """The session's VM sandbox: its record, what ``up`` printed, its VM nodes."""

    record: state.SandboxState
    up_output: str
    vms: vmkind.VmNodes
    image: images.NodeImage

    @property
    def directory(self) -> Path:
        return self.record.directory

    @property
    def node(self) -> vm.VmNode:
        return self.vms.handle(NODE)

    @property
    def key(self) -> firmware.SigningKey:
        return vmplanning.signing_key_path(self.directory)

    @property
    def address(self) -> str:
        """The VM node's address on the fabric."""
        return str(addressing.node_address(NODE_INDEX))


def kmm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``kmm ARGS...`` as a user runs it, its output wide enough not to wrap."""
    return subprocess.run(
        [str(KMM_CLI), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "COLUMNS": "250"},
    )


def node_image() -> images.NodeImage:
    """The cached node image, and every artefact the VM tests read checked."""
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    found = images.find(cache, chosen) if chosen is not None else None
    assert found is not None, "no VM node image: run `make vm-image vm-test-modules` first"
    for kernel in found.kernels.versions:
        assert (MODULES / kernel / f"{TEST_MODULE}.ko").is_file(), "run `make vm-test-modules`"
        assert toolkitimages.find(cache, found.kernels, kernel) is not None, (
            "run `make vm-toolkit-images` first"
        )
    for archive in (IMAGES / "pause.tar", IMAGES / "workload.tar"):
        assert archive.is_file(), "run `make test-images` first"
    for archive in (KMM_IMAGE, BUILDER_IMAGE):
        assert archive.is_file(), "run `make image` first"
    return found


@contextlib.contextmanager
def started() -> Iterator[Started]:
    """Up, the images pushed; down at the end whatever happened."""
    image = node_image()
    # Short: the sandbox's unix sockets live below it.
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="kv", dir="/tmp")))
    try:
        up = kmm(
            "sandbox", "up", "--dir", str(directory), "--nodes", "0",
            "--kubelet-nodes", "1", "--runtime", "containerd", "--vm-nodes", "1",
            "--accel", "tcg", "--pause-image", str(IMAGES / "pause.tar"),
            timeout=UP_TIMEOUT,
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        for archive, name, expected in (
            (IMAGES / "workload.tar", "workload:1", WORKLOAD),
            (KMM_IMAGE, "kmm/kmm:example", KMM),
            (BUILDER_IMAGE, "kmm/builder:1", BUILDER),
        ):
            assert containersandbox.push(directory, archive, name) == expected
        yield Started(
            record=cluster.status(directory),
            up_output=up.stdout,
            vms=cluster.vm_nodes(directory),
            image=image,
        )
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
