"""The sandbox's KWOK nodes behind the node interface (``nodekinds.NodeKind``).

``plan`` names them (``kmm-worker-<i>``, kernels round robin); ``start``
creates them through the API server once KWOK runs and waits until KWOK
made them Ready. They have no process of their own: ``stop`` has nothing to
do, and there is nothing to restart but KWOK itself (``kmm sandbox restart
kwok``). In a sandbox whose pods must really run somewhere (container or VM
nodes) they carry ``TAINT``, so no such pod lands where nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kmm.kube import client, kubeconfigs
from kmm.sandbox import errors, networking, nodekinds, processes, state
from kmm.sandbox.kwoknodes import nodes

__all__ = ["KIND", "TAINT", "KwokNodes", "of", "plan"]

KIND = "kwok"
TAINT = {"key": "kmm.sandbox/kwok", "value": "true", "effect": "NoSchedule"}


class KwokNodes:
    """A sandbox's KWOK nodes (``nodekinds.NodeKind``)."""

    def __init__(
        self,
        record: state.SandboxState,
        planned: Sequence[tuple[str, str]] = (),
        *,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> None:
        self._record = record
        self._planned = list(planned)
        self._taints = list(taints)

    @property
    def kind(self) -> str:
        return KIND

    @property
    def names(self) -> list[str]:
        return list(self._record.node_names)

    def attachments(self) -> list[networking.Attachment]:
        return []

    async def start(self, starting: nodekinds.Starting) -> None:
        log = self._record.directory / "logs" / "kwok.log"
        async with client.Client(kubeconfigs.load(self._record.kubeconfig)) as api:
            await nodes.create(api, self._planned, taints=self._taints)
            try:
                await nodes.wait_ready(api, self.names, timeout=starting.timeout)
            except TimeoutError as err:
                raise errors.ComponentFailed(
                    "kwok",
                    f"did not bring {len(self._planned)} fake node(s) to Ready within "
                    f"{starting.timeout:.0f} s",
                    log,
                    processes.log_tail(log),
                ) from err

    def stop(self) -> None:
        """Nothing: the nodes are objects in etcd, gone with the cluster."""

    async def restart(self, name: str, *, timeout: float) -> None:
        raise errors.SandboxError(
            f"{name} is a KWOK node: it has no process of its own to restart "
            "(`kmm sandbox restart kwok` restarts the controller that keeps it Ready)"
        )

    async def status(self) -> list[nodekinds.NodeInfo]:
        return self.describe()

    def describe(self) -> list[nodekinds.NodeInfo]:
        return [nodekinds.NodeInfo(name=name, kind=KIND) for name in self.names]


def plan(
    record: state.SandboxState, planned: Sequence[tuple[str, str]], *, tainted: bool
) -> KwokNodes:
    """The KWOK nodes ``planned`` ((name, kernel) pairs, ``nodes.spread``),
    tainted with ``TAINT`` when ``tainted``."""
    return KwokNodes(record, planned, taints=[TAINT] if tainted else [])


def of(record: state.SandboxState) -> KwokNodes:
    """The KWOK nodes of a running sandbox."""
    return KwokNodes(record)
