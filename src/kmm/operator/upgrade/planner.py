"""Ordered upgrades (seed 003): each node's move from one module version to the next.

The admin decides which node moves and when, by setting the node's user
label ``version-module.<ns>.<name>`` (or removing it); the operator makes the
move safe by walking two labels of its own, which the versioned DaemonSets
select on: ``version-module-loader`` (the loader of that version runs) and
``version-device-plugin`` (the device plugin, or DRA driver, of that version
runs). Per node, the three labels' states pick one action (KMM's table,
DESIGN §5), kept here as data:

=========  =========  =========  ===========================
user       loader     plugin     action
=========  =========  =========  ===========================
missing    present    present    remove the plugin label
missing    present    missing    remove the loader label
present    missing    missing    add the loader label (user's value)
present    same       missing    add the plugin label (user's value)
present    different  different  remove the plugin label
present    different  missing    remove the loader label
(others)                         nothing
=========  =========  =========  ===========================

("same"/"different": equal to the user's value or not.) Two guards make the
order safe: the loader label goes only once no device-plugin or DRA pod of
the Module is left on the node (the old module is not in use), and a new
loader label comes only once ``.ready`` is gone (the old module is
unloaded). A node the selector no longer picks is treated as one whose user
label is missing. ``.version.ready`` = v marks a node that runs version v,
loaded and with its device plugin Ready when there is one.

For a DRA Module, a third guard comes from ``taints`` (``Holding``): the
device-plugin label, whose removal sends the DRA driver away, stays while
the node's rules are not in place yet (with ``NoExecute``, the kubelet
needs the driver to unprepare the claims of the pods the taint evicts), and
while pods still hold claims on the Module's devices there (evicted,
tolerating the taint, or, under ``NoSchedule`` or on a cluster that serves
no DeviceTaintRules (effect ``UNTAINTED``), left to the admin); the step
names them.

``step`` names what a node is doing or waiting for; ``kmm upgrade`` and
``kmm status`` print the same words from the same function.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import labels
from kmm.operator import plans, views, workloads
from kmm.operator.loader import planner as loader_planner

__all__ = [
    "ACTIONS",
    "UNTAINTED",
    "Action",
    "Holding",
    "Step",
    "UpgradePlan",
    "holdings",
    "plan",
    "step",
]

# A Holding's effect where the cluster serves no DeviceTaintRules: no rule,
# nothing evicted; the users of the node's devices hold its driver all the same.
UNTAINTED: Final = ""

RawObject = dict[str, Any]
Presence = Literal["missing", "present", "same", "different"]


class Action(enum.Enum):
    REMOVE_PLUGIN_LABEL = "remove the device-plugin version label"
    REMOVE_LOADER_LABEL = "remove the module-loader version label"
    ADD_LOADER_LABEL = "add the module-loader version label"
    ADD_PLUGIN_LABEL = "add the device-plugin version label"
    NOTHING = "nothing"


# (user, loader, plugin) -> action; "present" stands for any value when the
# user label is missing, "same"/"different" compare with the user's value.
ACTIONS: Final[Mapping[tuple[Presence, Presence, Presence], Action]] = {
    ("missing", "present", "present"): Action.REMOVE_PLUGIN_LABEL,
    ("missing", "present", "missing"): Action.REMOVE_LOADER_LABEL,
    ("present", "missing", "missing"): Action.ADD_LOADER_LABEL,
    ("present", "same", "missing"): Action.ADD_PLUGIN_LABEL,
    ("present", "different", "different"): Action.REMOVE_PLUGIN_LABEL,
    ("present", "different", "missing"): Action.REMOVE_LOADER_LABEL,
}


def _presence(value: str | None, user: str | None) -> Presence:
    if value is None:
        return "missing"
    if user is None:
        return "present"
    return "same" if value == user else "different"


def action(user: str | None, loader: str | None, plugin: str | None) -> Action:
    """The table's action for a node's three version labels."""
    first: Presence = "missing" if user is None else "present"
    return ACTIONS.get((first, _presence(loader, user), _presence(plugin, user)), Action.NOTHING)


@dataclasses.dataclass(frozen=True)
class Holding:
    """What keeps a moving DRA node's driver there (``taints``): its
    DeviceTaintRules' ``effect``, whether they are all in place, and the
    pods (``<ns>/<name>``) holding claims on the tainted devices: those the
    taint evicts and those that stay (tolerating a NoExecute taint, or all
    of them under NoSchedule)."""

    effect: str
    rules_ready: bool = True
    evicted: tuple[str, ...] = ()
    staying: tuple[str, ...] = ()
    # What the eviction controller said of the rules (their
    # ``EvictionInProgress`` messages); None while it has said nothing.
    eviction: str | None = None

    def holds(self) -> bool:
        return not self.rules_ready or bool(self.evicted or self.staying)

    def describe(self) -> str:
        if not self.rules_ready:
            why = (
                "the DRA driver stays to unprepare the claims of the pods they evict"
                if self.effect == "NoExecute"
                else "no new claim gets the devices"
            )
            return (
                f"waiting for the {self.effect} DeviceTaintRules on the node's devices "
                f"before removing the device-plugin version label ({why})"
            )
        parts = []
        if self.evicted:
            # The API serves rules whatever the gates: only the controller's
            # answer shows that kube-controller-manager evicts.
            said = (
                f" (the eviction controller: {self.eviction})"
                if self.eviction
                else " (no word from the eviction controller yet: kube-controller-manager "
                "evicts only with its DRADeviceTaintRules feature on)"
            )
            parts.append(
                f"pod {', '.join(self.evicted)} evicted by the NoExecute device taint{said}"
            )
        if self.staying and self.effect == "NoExecute":
            parts.append(
                f"pod {', '.join(self.staying)} tolerates the NoExecute device taint and "
                "keeps the unload waiting until it is deleted"
            )
        elif self.staying and self.effect == UNTAINTED:
            parts.append(
                f"pod {', '.join(self.staying)} uses the Module's devices (no device taints: "
                "not evicted; delete it to go on)"
            )
        elif self.staying:
            parts.append(
                f"pod {', '.join(self.staying)} uses the Module's devices (NoSchedule: not "
                f'evicted; delete it, or annotate the Module {labels.EVICT_DEVICE_USERS}="true")'
            )
        return (
            "; ".join(parts) + "; waiting for their claims to be released before removing "
            "the device-plugin version label"
        )


def holdings(module: Mapping[str, Any]) -> dict[str, Holding]:
    """Per node in a move with tainted devices, what holds its DRA driver, as
    the operator last wrote it in a raw Module's ``status.deviceTaints``
    (for ``kmm status`` and ``kmm upgrade``: ``inspecting``)."""
    found: dict[str, Holding] = {}
    taints = (module.get("status") or {}).get("deviceTaints") or {}
    for entry in taints.get("nodes") or ():
        node, effect = entry.get("node"), entry.get("effect")
        if not isinstance(node, str):
            continue
        if effect is None and not entry.get("rules") and entry.get("staying"):
            # A server without DeviceTaintRules: the users hold the driver all the same.
            found[node] = Holding(effect=UNTAINTED, staying=tuple(entry["staying"]))
            continue
        if not isinstance(effect, str) or not entry.get("rules"):
            continue
        found[node] = Holding(
            effect=effect,
            rules_ready=entry.get("rulesReady") is not False,
            evicted=tuple(entry.get("evicted") or ()),
            staying=tuple(entry.get("staying") or ()),
            eviction=entry.get("eviction") or None,
        )
    return found


@dataclasses.dataclass(frozen=True)
class Step:
    """What a node is doing: the action taken now (or NOTHING), and in words."""

    action: Action
    description: str
    done: bool = False


def step(
    *,
    user: str | None,
    loader: str | None,
    plugin: str | None,
    ready: bool,
    loaded: bool,
    plugin_ready: bool,
    has_plugin: bool,
    blocking_pods: Sequence[str],
    noun: str = "device-plugin",
    holding: Holding | None = None,
) -> Step:
    """The step a node is at. ``ready``: the node's ``.ready`` label now;
    ``loaded``: its loader pod is Ready; ``blocking_pods``: device-plugin and
    DRA pods of the Module still on the node; ``has_plugin``: a device
    workload (``noun``: device plugin or DRA driver) should run there;
    ``holding``: what keeps the DRA driver there (device taints), if any."""
    found = action(user, loader, plugin)
    if found is Action.REMOVE_PLUGIN_LABEL and holding is not None and holding.holds():
        return Step(Action.NOTHING, holding.describe())
    if found is Action.REMOVE_LOADER_LABEL and blocking_pods:
        return Step(
            Action.NOTHING,
            f"{noun} pod {', '.join(sorted(blocking_pods))} still on the node; "
            "waiting before removing the module-loader version label",
        )
    if found is Action.ADD_LOADER_LABEL and ready:
        return Step(
            Action.NOTHING,
            "the old module is still loaded (.ready is set); "
            "waiting before adding the module-loader version label",
        )
    if found is Action.REMOVE_PLUGIN_LABEL:
        return Step(found, f"removing the device-plugin version label {plugin}")
    if found is Action.REMOVE_LOADER_LABEL:
        return Step(found, f"removing the module-loader version label {loader}")
    if found is Action.ADD_LOADER_LABEL:
        return Step(found, f"adding the module-loader version label {user}")
    if found is Action.ADD_PLUGIN_LABEL:
        return Step(found, f"adding the device-plugin version label {user}")
    if user is None:
        return Step(Action.NOTHING, "unloaded: no version label", done=loader is None)
    if not loaded:
        return Step(Action.NOTHING, f"waiting for the module-loader pod of {loader} to be Ready")
    if has_plugin and not plugin_ready:
        return Step(Action.NOTHING, f"waiting for the {noun} pod of {plugin} to be Ready")
    return Step(Action.NOTHING, f"{loader} loaded", done=True)


@dataclasses.dataclass
class UpgradePlan(plans.Plan):
    """The version labels wanted, and each node's step (for status and the CLI)."""

    steps: dict[str, Step] = dataclasses.field(default_factory=dict)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return found


def plan(
    view: views.ModuleView,
    loader: loader_planner.LoaderPlan,
    plugin: workloads.WorkloadPlan,
    holdings: Mapping[str, Holding] | None = None,
) -> UpgradePlan:
    """``plugin`` is the Module's device workload: its device plugin or its
    DRA driver (they are exclusive), gated by the same version label;
    ``holdings``: per node, what keeps the DRA driver there (``taints``)."""
    result = UpgradePlan()
    if view.version is None:
        return result
    ns, name = view.namespace, view.name
    user_key = labels.module_version(ns, name)
    loader_key = labels.module_loader_version(ns, name)
    plugin_key = labels.device_plugin_version(ns, name)
    ready_key = labels.ready(ns, name)
    selected = view.selected_names()
    for node_name, node in view.nodes().items():
        current = _labels(node)
        user = current.get(user_key) if node_name in selected else None
        loader_label, plugin_label = current.get(loader_key), current.get(plugin_key)
        blocking = [
            (pod.get("metadata") or {}).get("name", "?")
            for pod in view.pods_on(node_name, "device-plugin", "dra")
        ]
        found = step(
            user=user,
            loader=loader_label,
            plugin=plugin_label,
            ready=ready_key in current,
            loaded=node_name in loader.loaded,
            plugin_ready=node_name in plugin.ready,
            has_plugin=plugin.enabled and node_name in plugin.eligible,
            blocking_pods=blocking,
            noun=plugin.noun,
            holding=(holdings or {}).get(node_name),
        )
        result.steps[node_name] = found
        if found.action is Action.REMOVE_PLUGIN_LABEL:
            result.want(node_name, plugin_key, None)
        elif found.action is Action.REMOVE_LOADER_LABEL:
            result.want(node_name, loader_key, None)
        elif found.action is Action.ADD_LOADER_LABEL:
            result.want(node_name, loader_key, user)
        elif found.action is Action.ADD_PLUGIN_LABEL:
            result.want(node_name, plugin_key, user)
        # A DRA target made unschedulable runs no driver: done without one.
        finished = (
            node_name in loader.loaded
            and loader_label is not None
            and (
                not plugin.enabled
                or (
                    plugin_label == loader_label
                    and (node_name in plugin.ready or node_name not in plugin.eligible)
                )
            )
        )
        result.want(node_name, labels.version_ready(ns, name), loader_label if finished else None)
    return result
