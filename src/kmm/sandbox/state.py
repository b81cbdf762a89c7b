"""The record of a running sandbox, kept as ``sandbox.json`` in its directory.

It is what ``down`` and ``status`` work from, so it is written atomically and
names every process with its pid start time (see ``processes``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from kmm.sandbox import processes

__all__ = ["STATE_FILE", "RegistryRecord", "SandboxState", "load", "save"]

STATE_FILE = "sandbox.json"
_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class RegistryRecord:
    """The sandbox's registry: the host loopback port it serves on, the
    host[:port] image references name (reached from nodes and pods), and the
    dockerconfigjson of its credentials when it asks for any."""

    host_port: int
    reference_host: str
    credentials: Path | None = None

    @property
    def host(self) -> str:
        """Where a client on the host reaches it."""
        return f"127.0.0.1:{self.host_port}"


@dataclasses.dataclass
class SandboxState:
    directory: Path
    server: str
    kubeconfig: Path
    launched: list[processes.Process]
    node_names: list[str]
    versions: dict[str, str]
    # Nodes served by real kubelets on the host (the host sysctls they
    # change are ``hostsysctls``').
    kubelet_nodes: list[str] = dataclasses.field(default_factory=list)
    # Which kubelet nodes run containerd (``--runtime containerd``), and the
    # cgroup every container of theirs lives under (``kmm-sandbox-<id>``,
    # in every hierarchy; ``down`` removes it).
    container_nodes: list[str] = dataclasses.field(default_factory=list)
    cgroup_parent: str = ""
    registry: RegistryRecord | None = None
    # VM nodes (``vmnodes``): qemu guests, each under ``vms/<i>``.
    vm_nodes: list[str] = dataclasses.field(default_factory=list)

    def alive(self) -> list[processes.Process]:
        return [process for process in self.launched if process.alive()]


def save(state: SandboxState) -> None:
    document: dict[str, Any] = {
        "format": _FORMAT,
        "server": state.server,
        "kubeconfig": str(state.kubeconfig),
        "versions": state.versions,
        "nodes": state.node_names,
        "kubeletNodes": state.kubelet_nodes,
        "containerNodes": state.container_nodes,
        "cgroupParent": state.cgroup_parent,
        "registry": _registry_document(state.registry),
        "vmNodes": state.vm_nodes,
        "processes": [
            {
                "name": process.name,
                "pid": process.pid,
                "startTicks": process.start_ticks,
                "log": str(process.log),
                "argv": list(process.argv),
                "healthUrl": process.health_url,
            }
            for process in state.launched
        ],
    }
    target = state.directory / STATE_FILE
    temporary = target.with_suffix(".tmp")
    with temporary.open("w") as stream:
        json.dump(document, stream, indent=2)
        stream.flush()
        os.fsync(stream.fileno())
    temporary.replace(target)


def load(directory: Path) -> SandboxState | None:
    """The recorded state, or None when the directory holds no sandbox."""
    path = directory / STATE_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not a readable sandbox record: {err}") from err
    if document.get("format") != _FORMAT:
        raise ValueError(f"{path} has record format {document.get('format')!r}, expected {_FORMAT}")
    return SandboxState(
        directory=directory,
        server=document["server"],
        kubeconfig=Path(document["kubeconfig"]),
        versions=dict(document["versions"]),
        node_names=list(document["nodes"]),
        kubelet_nodes=list(document.get("kubeletNodes") or ()),
        container_nodes=list(document.get("containerNodes") or ()),
        cgroup_parent=str(document.get("cgroupParent") or ""),
        registry=_registry_record(document.get("registry")),
        vm_nodes=list(document.get("vmNodes") or ()),
        launched=[
            processes.Process(
                name=entry["name"],
                pid=entry["pid"],
                start_ticks=entry["startTicks"],
                log=Path(entry["log"]),
                argv=tuple(entry["argv"]),
                health_url=entry.get("healthUrl", ""),
            )
            for entry in document["processes"]
        ],
    )


def _registry_document(record: RegistryRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "hostPort": record.host_port,
        "referenceHost": record.reference_host,
        "credentials": str(record.credentials) if record.credentials else None,
    }


def _registry_record(document: dict[str, Any] | None) -> RegistryRecord | None:
    if not document:
        return None
    credentials = document.get("credentials")
    return RegistryRecord(
        host_port=int(document["hostPort"]),
        reference_host=str(document["referenceHost"]),
        credentials=Path(credentials) if credentials else None,
    )
