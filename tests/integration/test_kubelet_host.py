"""Kubelet nodes change nothing on the host outside the sandbox dir.

The kubelet's fixed host paths are covered in its node's private mount
namespace, the sysctls it sets are written back by ``down`` (by the last
``down`` when two such sandboxes run at once), the host's
network namespace gains nothing (not while the sandbox runs either), and no
holder, namespace or mount outlives ``down``. Container nodes add shims,
containers, their cgroups and namespaces and iptables rules: none outlives
``down`` either, and the host's own rules and conntrack limits are untouched.
Its own module: no other kubelet sandbox may run while the host is compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import namespacing
import pytest

from kmm.cli import paths
from kmm.kube import resources
from kmm.sandbox import cluster, hostsysctls, state
from kmm.sandbox.containernodes import cgroups as node_cgroups
from kmm.sandbox.containernodes import nodes as containernodes

# Values the kubelet changes (it wants 1, 10 and 1), safe to hold meanwhile.
# The host is set to them first, so the restore is checked even on a machine
# where an earlier sandbox, killed before its ``down``, left the kubelet's.
_NOT_THE_KUBELETS = {"vm/overcommit_memory": "0", "kernel/panic": "0", "kernel/panic_on_oops": "0"}


@pytest.fixture
def foreign_sysctls() -> Iterator[None]:
    found = hostsysctls.read()
    hostsysctls.restore({k: v for k, v in _NOT_THE_KUBELETS.items() if k in found})
    try:
        yield
    finally:
        hostsysctls.restore(found)


def _host_view() -> dict[str, object]:
    found: dict[str, object] = {
        path: sorted(os.listdir(path)) if os.path.isdir(path) else None
        for path in ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods")
    }
    found.update(hostsysctls.read())
    return found


def _mounts() -> list[str]:
    # Mount ids and points of the host's mount namespace (this process's).
    return sorted(
        line.split(" ", 5)[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


@pytest.mark.usefixtures("foreign_sysctls")
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
        during = hostsysctls.read()
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


@pytest.mark.usefixtures("foreign_sysctls")
async def test_two_sandboxes_with_kubelets_at_once_leave_the_host_as_it_was() -> None:
    """A second sandbox does not take the first one's kubelet values for the
    host's: the first ``down`` writes nothing back while the other's kubelets
    run, the last writes back what the host had before either."""
    before = hostsysctls.read()
    directories = [Path(tempfile.mkdtemp(prefix="k", dir="/tmp")) for _ in range(2)]
    first, second = (
        cluster.Options(directory=d, cache_dir=paths.cache_dir(), nodes=0, kubelet_nodes=1)
        for d in directories
    )
    try:
        await cluster.up(first)
        await cluster.up(second)
        during = hostsysctls.read()
        cluster.down(first.directory)
        after_first = hostsysctls.read()
        holding = hostsysctls.users()
        cluster.down(second.directory)
    finally:
        for directory in directories:
            with contextlib.suppress(Exception):
                cluster.down(directory)
            shutil.rmtree(directory, ignore_errors=True)
    assert during != before  # the kubelets did change them
    assert after_first == during
    assert holding == [str(second.directory.resolve())]
    assert hostsysctls.read() == before
    assert hostsysctls.users() == []


def _iptables() -> str:
    # The host namespace's rules, counters left out (they move on their own).
    found = []
    for tool in ("iptables-save", "ip6tables-save"):
        result = subprocess.run([tool], capture_output=True, text=True, check=False)
        found += [line for line in result.stdout.splitlines() if line[:1] not in ("#", ":")]
    return "\n".join(found)


def _container_host_view() -> dict[str, object]:
    found = _host_view()
    found.update(
        {
            path: sorted(os.listdir(path)) if os.path.isdir(path) else None
            for path in (*containernodes.MOUNTED, "/etc", "/opt", "/run", "/var/lib")
        }
    )
    # Global conntrack limits kube-proxy would set by default.
    for name in (
        "net/netfilter/nf_conntrack_max",
        "net/netfilter/nf_conntrack_tcp_timeout_established",
        "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    ):
        path = Path("/proc/sys") / name
        found[name] = path.read_text() if path.exists() else None
    found["iptables"] = _iptables()
    return found


def _shims(directory: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in argv and str(directory).encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.usefixtures("foreign_sysctls")
async def test_container_nodes_leave_no_shim_cgroup_namespace_mount_or_rule() -> None:
    before = _container_host_view()
    mounts_before = _mounts()
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="k", dir="/tmp")))
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=1,
        kubelet_nodes=1,
        runtime="containerd",
        pause_image=Path("build/images/pause.tar").resolve(),
    )
    record = await cluster.up(options)
    try:
        name = f"pause-{uuid.uuid4().hex[:6]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": record.kubelet_nodes[0],
                "containers": [{"name": "main", "image": containernodes.PAUSE_IMAGE}],
            },
        }
        async with cluster.api_client(record.kubeconfig) as api:
            await api.request("POST", resources.PODS.path(namespace="default"), body=pod)
            async with asyncio.timeout(120):
                while True:
                    got = await api.request(
                        "GET", resources.PODS.path(namespace="default", name=name)
                    )
                    if (got.get("status") or {}).get("phase") == "Running":
                        break
                    await asyncio.sleep(0.3)
        parent = record.cgroup_parent
        cgroups = [h / parent for h in node_cgroups.cgroup_hierarchies() if (h / parent).is_dir()]
        contained = {
            int(pid)
            for cgroup in cgroups
            for procs in cgroup.rglob("cgroup.procs")
            for pid in procs.read_text().split()
        }
        shims = _shims(directory)
        # The pinned shim (PATH puts the pinned directory first), never another.
        shim_programs = {Path(os.readlink(f"/proc/{pid}/exe")) for pid in shims}
        holders = [p for p in record.launched if p.name == "fabric"]
        holders += [p for p in record.launched if p.name.startswith("node/")]
        pids = [p.pid for p in holders] + sorted(contained)
        net_ids = {os.readlink(f"/proc/{pid}/ns/net") for pid in pids}
        # The fabric's holder has no mount namespace of its own.
        mnt_ids = {os.readlink(f"/proc/{pid}/ns/mnt") for pid in pids[1:]}
    finally:
        cluster.down(options.directory)
        shutil.rmtree(directory, ignore_errors=True)
    assert os.readlink("/proc/self/ns/mnt") not in mnt_ids
    # What there was to clean up: the pod's pause and sandbox processes, a
    # shim, the pod's own network namespace besides the node's and fabric's.
    assert contained
    assert shims
    assert all(program.is_relative_to(paths.cache_dir()) for program in shim_programs)
    assert len(net_ids) >= 3
    assert not [pid for pid in (*contained, *shims) if namespacing.alive(pid)]
    assert not [cgroup for cgroup in cgroups if cgroup.exists()]
    assert not net_ids & namespacing.namespace_ids("net")
    assert not mnt_ids & namespacing.namespace_ids("mnt")
    assert _mounts() == mounts_before
    assert _container_host_view() == before
