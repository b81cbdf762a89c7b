"""Node label changes for one Module, computed from what should be true (pure).

Three kinds of node label follow the cluster (DESIGN §4-§5):
- ``kernel-version.full`` on every selected node that reports a kernel, so
  loader DaemonSets can select on it. It is shared by all Modules (each
  computes the same value) and is left in place when a Module goes;
- ``<ns>.<name>.ready`` exactly on the nodes whose loader pod is Ready;
- ``<ns>.<name>.device-plugin-ready`` exactly where the plugin pod is Ready.

A change is ``{label: value}`` to set or ``{label: None}`` to remove, which is
also the body of a JSON merge patch of ``metadata.labels``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kmm.api import labels

__all__ = ["LabelChanges", "changes"]

LabelChanges = dict[str, dict[str, str | None]]


def changes(
    nodes: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    name: str,
    kernel_labels: Mapping[str, str],
    ready: Iterable[str],
    plugin_ready: Iterable[str],
) -> LabelChanges:
    """Per node name, the labels to set or remove; nodes needing nothing are absent."""
    ready_key = labels.ready(namespace, name)
    plugin_key = labels.device_plugin_ready(namespace, name)
    ready_set, plugin_set = set(ready), set(plugin_ready)
    result: LabelChanges = {}
    for node in nodes:
        metadata = node.get("metadata") or {}
        node_name: str = metadata["name"]
        current: Mapping[str, str] = metadata.get("labels") or {}
        change: dict[str, str | None] = {}
        kernel = kernel_labels.get(node_name)
        if kernel is not None and current.get(labels.KERNEL_VERSION_FULL) != kernel:
            change[labels.KERNEL_VERSION_FULL] = kernel
        for key, wanted in (
            (ready_key, node_name in ready_set),
            (plugin_key, node_name in plugin_set),
        ):
            if wanted and current.get(key) != "":
                change[key] = ""
            elif not wanted and key in current:
                change[key] = None
        if change:
            result[node_name] = change
    return result
