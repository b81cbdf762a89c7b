"""Kubelet nodes change nothing on the host outside the sandbox dir.

The kubelet's fixed host paths are covered in its private mount namespace,
and the three sysctls it sets are written back by ``down``. Its own module:
no other kubelet sandbox may run while the host is compared.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kmm.cli import paths
from kmm.sandbox import cluster, kubeletnodes


def _host_view() -> dict[str, object]:
    found: dict[str, object] = {
        path: sorted(os.listdir(path)) if os.path.isdir(path) else None
        for path in ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods")
    }
    found.update(kubeletnodes.read_sysctls())
    return found


async def test_up_and_down_change_nothing_outside_the_sandbox_dir() -> None:
    before = _host_view()
    directory = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))  # short: sockets live under it
    options = cluster.Options(
        directory=directory, cache_dir=paths.cache_dir(), nodes=0, kubelet_nodes=1
    )
    await cluster.up(options)
    try:
        during = kubeletnodes.read_sysctls()
    finally:
        cluster.down(options.directory)
        shutil.rmtree(directory, ignore_errors=True)
    assert _host_view() == before
    # The kubelet did change them while it ran: the restore is not vacuous.
    assert during != {k: before[k] for k in during}
