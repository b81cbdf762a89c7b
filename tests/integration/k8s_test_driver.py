"""The Kubernetes project's own DRA test driver, as a second, independent driver.

``k8s.io/kubernetes/test/e2e/dra/test-driver`` at the pinned version, built
like the sandbox's binaries (``components.DRA_TEST_DRIVER``) and run with its
``kubelet-plugin`` subcommand for one node: it publishes ``--num-devices``
devices (``device-00``...) in a pool named after the node, writes one CDI
spec per prepared claim and request (``<driver>-<claim uid>-<request>.json``,
environment edits only), remembers what it prepared in memory only, and
serves the health service without reporting any device.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Protocol

import test_kubelet_nodes as real

from kmm.cli import paths
from kmm.sandbox import building, components

__all__ = ["TestDriver", "binary"]


class _Node(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def directory(self) -> Path: ...

    @property
    def root(self) -> Path: ...

    @property
    def kubelet_dir(self) -> Path: ...

    @property
    def cdi_dir(self) -> Path: ...


class _Sandbox(Protocol):
    @property
    def kubeconfig(self) -> Path: ...


def binary() -> Path:
    """The test driver's binary, built on first use (``make test`` builds it first)."""
    built = asyncio.run(building.ensure_built(paths.cache_dir(), (components.DRA_TEST_DRIVER,)))
    return built["dra-test-driver"]


class TestDriver(real.LoggedProcess):
    """``dra-test-driver kubelet-plugin`` for one driver name on the node."""

    __test__ = False  # not a pytest class

    def __init__(self, sandbox: _Sandbox, node: _Node, executable: Path) -> None:
        self.sandbox, self.node, self.executable = sandbox, node, executable
        self.module = f"t{uuid.uuid4().hex[:6]}"
        self.name = f"{self.module}.test.k8s.io"
        self.log = node.directory / f"test-driver-{self.module}.log"

    async def start(self) -> None:
        # It creates only the parent of its socket directory; its DaemonSet's
        # hostPath volume would create the rest.
        (self.node.kubelet_dir / "plugins" / self.name).mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                str(self.executable), f"--kubeconfig={self.sandbox.kubeconfig}",
                f"--drivername={self.name}", "-v=6",
                "kubelet-plugin", f"--node-name={self.node.name}", "--num-devices=2",
                f"--plugin-registration-path={self.node.kubelet_dir / 'plugins_registry'}",
                f"--datadir={self.node.kubelet_dir / 'plugins'}",
                f"--cdi-dir={self.node.cdi_dir}",
                stderr=log, stdout=log,
            )  # fmt: skip

    def registrations(self) -> int:
        # -v=6 logs every gRPC call the plugin answered.
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return sum(
            1
            for line in lines
            if "handling request succeeded" in line and "/NotifyRegistrationStatus" in line
        )
