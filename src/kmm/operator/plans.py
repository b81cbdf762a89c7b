"""What one concern of a reconcile wants: the common shape of every planner's answer.

Each concern's planner (``loader``, ``deviceplugin``, ``dra``, ``upgrade``) is a
pure function of a ``views.ModuleView`` returning a ``Plan`` (plus the facts
the next planner and the status need). A ``Plan`` says:

- ``apply``: desired DaemonSets to send (only those missing or changed);
- ``delete``: names of the Module's DaemonSets to delete;
- ``labels``: per node, the value each node label this concern owns should
  have (``None``: absent). ``nodelabels.merge`` turns the wanted values of
  all planners into one patch per node, writing only what differs.

A planner owns its label keys: two planners never want the same key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Plan", "WantedLabels"]

RawObject = dict[str, Any]
WantedLabels = dict[str, dict[str, str | None]]


@dataclasses.dataclass
class Plan:
    apply: list[RawObject] = dataclasses.field(default_factory=list)
    delete: list[str] = dataclasses.field(default_factory=list)
    labels: WantedLabels = dataclasses.field(default_factory=dict)

    def want(self, node: str, key: str, value: str | None) -> None:
        self.labels.setdefault(node, {})[key] = value
