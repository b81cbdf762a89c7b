"""Why a module did not load on a node, read back from its loader pod (pure).

A loader pod loads in ``postStart``, whose output reaches only a kubelet
Event; the operator reads neither Events nor logs. So the hook's script
writes why it failed to the container's termination message
(``scripts``), and the kubelet, which kills a container whose ``postStart``
failed, keeps it: as ``state.terminated.message`` while the container is
down, as ``lastState.terminated.message`` once it runs again (retried with
the kubelet's back-off). The operator's cache keeps those messages of loader
pods (``caches.project_pod``).

``report`` is that message for a pod whose module is not loaded: a Ready
pod loaded (its hook succeeded), so a message left by an earlier attempt is
history, and a pod being deleted is leaving. ``problem`` makes the failing
nodes the Module's Degraded ``ModuleLoadFailed``, naming the nodes, the
module and the report (the kernel's answer: "Key was rejected by service",
"Unknown symbol in module", a module still in use). The node gets no
``.ready`` label: its pod is not Ready (``planner``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kmm.api import conditions
from kmm.operator import failures, status, views
from kmm.operator.loader import builders as loader_builders

__all__ = ["problem", "report"]

# Nodes named per report; the rest are counted.
_NODES_NAMED: Final = 3


def report(pod: Mapping[str, Any]) -> str | None:
    """What the loader container's failed hook wrote last, unless the pod
    loaded (Ready, or ContainersReady on a node that stopped reporting) or
    is being deleted; None when it wrote nothing."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if views.is_pod_ready(pod) or views.containers_ready(pod):
        return None
    for found in (pod.get("status") or {}).get("containerStatuses") or ():
        if found.get("name") != loader_builders.CONTAINER:
            continue
        for part in ("state", "lastState"):
            message = ((found.get(part) or {}).get("terminated") or {}).get("message")
            if isinstance(message, str) and message.strip():
                return message.strip()
    return None


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _nodes(names: list[str]) -> str:
    named = ", ".join(names[:_NODES_NAMED])
    more = len(names) - _NODES_NAMED
    if more > 0:
        return f"nodes {named} and {more} more"
    return f"node {named}" if len(names) == 1 else f"nodes {named}"


def problem(module_name: str | None, failed: Mapping[str, str]) -> status.Problem | None:
    """The Module's ``ModuleLoadFailed`` for ``failed`` (node -> report),
    nodes of the same report together, the most nodes first; None if none
    failed. ``module_name`` None: ``rawArgs`` load it."""
    if not failed:
        return None
    by_report: dict[str, list[str]] = {}
    for node, text in sorted(failed.items()):
        by_report.setdefault(_one_line(text), []).append(node)
    what = f"module {module_name}" if module_name else "the module (rawArgs.load)"
    message = "; ".join(
        f"{what} did not load on {_nodes(nodes)}: {text}"
        for text, nodes in sorted(by_report.items(), key=lambda item: (-len(item[1]), item[0]))
    )
    if len(message) > failures.MAX_MESSAGE:
        message = message[: failures.MAX_MESSAGE - 1] + "…"
    return status.Problem(conditions.REASON_MODULE_LOAD_FAILED, message)
