"""Kubelet nodes change nothing on the host outside the sandbox dir.

The kubelet's fixed host paths are covered in its node's private mount
namespace, the three sysctls it sets are written back by ``down``, the host's
network namespace gains nothing (not while the sandbox runs either), and no
holder, namespace or mount outlives ``down``. Its own module: no other
kubelet sandbox may run while the host is compared.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import namespacing

from kmm.cli import paths
from kmm.sandbox import cluster, kubeletnodes, state


def _host_view() -> dict[str, object]:
    found: dict[str, object] = {
        path: sorted(os.listdir(path)) if os.path.isdir(path) else None
        for path in ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods")
    }
    found.update(kubeletnodes.read_sysctls())
    return found


def _mounts() -> list[str]:
    # Mount ids and points of the host's mount namespace (this process's).
    return sorted(
        line.split(" ", 5)[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


async def test_up_and_down_change_nothing_outside_the_sandbox_dir() -> None:
    before = _host_view()
    directory = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))  # short: sockets live under it
    options = cluster.Options(
        directory=directory, cache_dir=paths.cache_dir(), nodes=0, kubelet_nodes=1
    )
    network_before = namespacing.host_network()
    mounts_before = _mounts()
    record = await cluster.up(options)
    try:
        during = kubeletnodes.read_sysctls()
        network_during = namespacing.host_network()
        holders = [p for p in record.launched if p.name == "fabric" or p.name.startswith("node/")]
        net_ids = {os.readlink(f"/proc/{p.pid}/ns/net") for p in holders}
        mnt_ids = {os.readlink(f"/proc/{p.pid}/ns/mnt") for p in holders if p.name != "fabric"}
    finally:
        cluster.down(options.directory)
        recorded = state.load(directory)
        shutil.rmtree(directory, ignore_errors=True)
    assert _host_view() == before
    # The fabric and one node: each a namespace of its own, none the host's.
    assert len(net_ids) == 2
    assert len(mnt_ids) == 1
    assert network_during == network_before
    assert namespacing.host_network() == network_before
    assert _mounts() == mounts_before
    assert recorded is not None
    assert not [p.name for p in recorded.launched if p.alive()]
    assert not net_ids & namespacing.namespace_ids("net")
    assert not mnt_ids & namespacing.namespace_ids("mnt")
    # The kubelet did change them while it ran: the restore is not vacuous.
    assert during != {k: before[k] for k in during}
