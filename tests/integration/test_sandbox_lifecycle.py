"""A sandbox of its own per test here: ``up`` refuses a directory in use,
``down`` stops every process it started and nothing else, the CLI reports.

``own_sandbox`` is the same for other modules' fixtures: a sandbox under a
short /tmp directory, torn down after, failing if a process outlives it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import namespacing
import pytest

from kmm.cli import paths
from kmm.sandbox import building, cluster, components, errors, state, testing


def processes_mentioning(directory: Path) -> list[int]:
    """Live pids whose command line names ``directory`` (every component's does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if str(directory).encode() in cmdline and namespacing.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def own_sandbox(prefix: str, **options: Any) -> Iterator[testing.RunningSandbox]:
    """A sandbox of the caller's own (``options`` go to ``cluster.Options``);
    down after, and no process left that names its directory."""
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    chosen = cluster.Options(directory=directory, cache_dir=paths.cache_dir(), **options)
    record = asyncio.run(cluster.up(chosen))
    try:
        yield testing.RunningSandbox.of(record, chosen.kernels)
    finally:
        cluster.down(directory)
        left = processes_mentioning(directory)
        shutil.rmtree(directory, ignore_errors=True)
        assert left == [], f"processes left running: {left}"


def _listening_addresses(pids: set[int]) -> list[str]:
    """Local addresses (hex ip:port, as /proc/net shows them) of sockets the
    given processes listen on, over TCP and TCP6."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                listening.append(local)
    return listening


async def test_down_leaves_no_process_and_a_running_dir_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "own"
    options = cluster.Options(directory=directory, cache_dir=paths.cache_dir(), nodes=1)
    record = await cluster.up(options)
    try:
        pids = {process.pid for process in record.launched}
        assert {process.name for process in record.launched} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        assert set(processes_mentioning(directory.resolve())) == pids
        # Every component listens, and only on 127.0.0.1 (0100007F in /proc/net/tcp).
        addresses = _listening_addresses(pids)
        assert len(addresses) >= len(pids)
        assert {address.split(":")[0] for address in addresses} == {"0100007F"}
        with pytest.raises(errors.SandboxInUse, match="already running"):
            await cluster.up(options)
        # The refused start changed nothing: the same processes still run.
        assert {p.pid for p in state.load(directory.resolve()).alive()} == pids  # type: ignore[union-attr]
    finally:
        stopped = cluster.down(directory)
    assert {process.pid for process in stopped} == pids
    assert processes_mentioning(directory.resolve()) == []
    assert not any(namespacing.alive(pid) for pid in pids)


def test_cli_up_status_down(tmp_path: Path) -> None:
    kmm = shutil.which("kmm", path=str(Path(sys.executable).parent))
    assert kmm is not None
    directory = tmp_path / "cli"
    env = dict(os.environ, KMM_CACHE_DIR=str(paths.cache_dir()))
    up = subprocess.run(
        [kmm, "sandbox", "up", "--dir", str(directory), "--nodes", "2", "--kernel", "6.8.0-1-test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "2 node(s) Ready" in up.stdout
        assert f"export KUBECONFIG={directory.resolve() / 'kubeconfig'}" in up.stdout
        # The kubectl line works as printed: its PATH finds the pinned
        # kubectl and the kubectl-kmm plugin, whatever else is installed.
        (hint,) = [line for line in up.stdout.splitlines() if "export PATH=" in line]
        path = hint.split("export PATH=", 1)[1].split(";", 1)[0].replace("$PATH", "/usr/bin:/bin")
        kubectl_env = dict(env, PATH=path, KUBECONFIG=str(directory / "kubeconfig"))
        nodes = subprocess.run(
            ["kubectl", "get", "nodes", "--output", "name"],
            env=kubectl_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert nodes.returncode == 0, nodes.stderr
        assert len(nodes.stdout.split()) == 2
        assert shutil.which("kubectl", path=path) == str(
            building.binary_dir(paths.cache_dir(), components.KUBECTL) / "kubectl"
        )
        assert shutil.which("kubectl-kmm", path=path) is not None
        shown = subprocess.run(
            [kmm, "sandbox", "status", "--dir", str(directory)],
            env=dict(env, COLUMNS="200"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            assert name in shown.stdout
        assert shown.stdout.count("6.8.0-1-test") == 2
        assert "control plane RSS" in shown.stdout
    finally:
        down = subprocess.run(
            [kmm, "sandbox", "down", "--dir", str(directory)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(directory.resolve()) == []
    again = subprocess.run(
        [kmm, "sandbox", "status", "--dir", str(tmp_path / "nothing-here")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1
    assert "no sandbox recorded" in again.stderr


def test_cli_build_reports_every_binary_from_the_cache() -> None:
    kmm = shutil.which("kmm", path=str(Path(sys.executable).parent))
    assert kmm is not None
    built = subprocess.run(
        [kmm, "sandbox", "build"],
        env=dict(os.environ, KMM_CACHE_DIR=str(paths.cache_dir()), COLUMNS="300"),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    lines = dict(line.split(maxsplit=1) for line in built.stdout.splitlines())
    assert set(lines) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "kubelet",
        "kmm-fake-cri",
        "dra-test-driver",  # a peer: what kmm kubelet is checked with
        "kubectl",  # the clients: kubectl of the pinned release, and helm
        "helm",
        # container nodes' runtime, network and proxy, and the registry
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "bridge",
        "host-local",
        "loopback",
        "portmap",
        "kube-proxy",
        "registry",
    }
    for path in lines.values():
        assert os.access(path, os.X_OK), path
