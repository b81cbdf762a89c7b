"""The concerns' planners asked for one view, in order, and what their answers say (pure).

``ask`` asks each concern's planner in the order their answers feed each
other: the loader first (where the module is loaded; it skips the kernels
the build concern gates, and loads a built image by the digest it pins),
then the two device workloads, ``deviceplugin`` and ``dra`` (they run
where the module is loaded), then the device taints of a DRA Module's
moving nodes (``upgrade.taints``: its DeviceTaintRules, and what holds the
driver on each node), then the ordered ``upgrade`` (version labels, with
whichever device workload the Module has, and those holds). Each call is a named step
(``failures.step``), so a planner's bug shows on the Module as that step.
``Answers`` holds what they said; ``Answers.concerns`` is every answer that is
a ``plans.Plan``, in that order (their DaemonSets and node labels).

``observed`` is what the answers say for the Module's status
(``status.Observed``: counts, readiness, mapping errors, the problems the
sending met, and ``ModuleLoadFailed`` where loader pods reported why they
did not load: ``loader.reports``), for ``status.compute``.

Limits: no I/O and no memory. The build concern is asked before this (its
plan needs I/O: ``build.concern``); sending the answers is the
reconciler's (``reconciler`` and the senders beside it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from kmm.api import modules
from kmm.operator import deviceapis, failures, plans, status, views
from kmm.operator.deviceplugin import planner as deviceplugin_planner
from kmm.operator.dra import planner as dra_planner
from kmm.operator.loader import planner as loader_planner
from kmm.operator.loader import reports as loader_reports
from kmm.operator.upgrade import planner as upgrade_planner
from kmm.operator.upgrade import taints as upgrade_taints

__all__ = ["Answers", "ask", "observed"]


@dataclasses.dataclass(frozen=True)
class Answers:
    """Each concern's answer for one view."""

    loader: loader_planner.LoaderPlan
    plugin: deviceplugin_planner.PluginPlan
    driver: dra_planner.DraPlan
    upgrade: upgrade_planner.UpgradePlan
    taints: upgrade_taints.TaintPlan = dataclasses.field(default_factory=upgrade_taints.TaintPlan)

    def concerns(self) -> tuple[plans.Plan, ...]:
        """Every answer, in the order the planners were asked."""
        return (self.loader, self.plugin, self.driver, self.upgrade)


def ask(
    view: views.ModuleView,
    *,
    gated: Collection[str] = frozenset(),
    pins: Mapping[str, str] | None = None,
) -> Answers:
    """Ask each concern's planner, in the order their answers feed each
    other: the loader first (where the module is loaded), the two device
    workloads (which run there), then the ordered upgrade (with whichever
    device workload the Module has). Each call is a named step, so a
    planner's bug shows on the Module as that step."""
    with failures.step("planning the module loader"):
        loader = loader_planner.plan(view, gated=gated, pins=pins)
    with failures.step("planning the device plugin"):
        plugin = deviceplugin_planner.plan(view, loader)
    with failures.step("planning the DRA driver"):
        driver = dra_planner.plan(view, loader)
    devices = driver if driver.enabled else plugin
    with failures.step("planning the device taints"):
        taints = upgrade_taints.plan(view)
    with failures.step("planning the ordered upgrade"):
        moving = upgrade_planner.plan(view, loader, devices, taints.holdings())
    return Answers(loader=loader, plugin=plugin, driver=driver, upgrade=moving, taints=taints)


def observed(
    view: views.ModuleView, answers: Answers, problems: list[status.Problem]
) -> status.Observed:
    """What the reconcile saw, for ``status.compute``."""
    loader, plugin, driver = answers.loader, answers.plugin, answers.driver
    versioned = view.version is not None
    selected = len(view.selected)
    devices = driver if driver.enabled else plugin
    return status.Observed(
        selected=selected,
        loader=status.counts(selected, loader.current, versioned=versioned)
        if view.module.spec.module_loader is not None
        else None,
        plugin=status.counts(len(plugin.wanted), plugin.current, versioned=versioned)
        if plugin.enabled
        else None,
        dra=status.counts(len(driver.wanted), driver.current, versioned=versioned)
        if driver.enabled
        else None,
        targeted=len(loader.targeted),
        ready=len(loader.loaded),
        plugin_wanted=len(devices.wanted),
        plugin_ready=len(devices.ready & devices.wanted),
        mapping_errors=loader.grouping.errors,
        devices="DRA drivers" if driver.enabled else "device plugins",
        problems=[*problems, *_load_failures(view, loader)],
        device_taints=device_taints(answers.taints),
    )


def device_taints(found: upgrade_taints.TaintPlan) -> modules.DeviceTaintsStatus | None:
    """``status.deviceTaints``: only for a DRA Module with ordered upgrades."""
    if not found.enabled:
        return None
    nodes = []
    for _, entry in sorted(found.nodes.items()):
        holding = entry.holding
        evicted = list(holding.evicted) if holding is not None else []
        staying = list(holding.staying) if holding is not None else []
        nodes.append(
            modules.NodeDeviceTaints(
                node=entry.node,
                effect=entry.effect if entry.rules else None,
                rules=list(entry.rules) or None,
                rules_ready=holding.rules_ready if holding is not None and entry.rules else None,
                evicted=evicted or None,
                staying=staying or None,
                eviction=holding.eviction if holding is not None else None,
                message=entry.message,
            )
        )
    return modules.DeviceTaintsStatus(
        api_version=f"{deviceapis.GROUP}/{found.api}" if found.api else None,
        message=found.message,
        nodes=nodes or None,
    )


def _load_failures(
    view: views.ModuleView, loader: loader_planner.LoaderPlan
) -> list[status.Problem]:
    """``ModuleLoadFailed``, where loader pods reported why they did not load."""
    spec = view.module.spec.module_loader
    name = spec.container.modprobe.module_name if spec is not None else None
    found = loader_reports.problem(name, loader.failed)
    return [found] if found is not None else []
