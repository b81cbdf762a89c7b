"""The device plugin concern: a Module's ``spec.devicePlugin`` DaemonSet and its readiness.

``planner`` (pure) wants one device-plugin DaemonSet (one per version with
ordered upgrades) where the module is loaded, or on every selected node for
an in-tree driver, and ``<ns>.<name>.device-plugin-ready`` where its pod is
Ready; it answers the shared ``workloads.WorkloadPlan``. ``builders`` (pure)
renders that DaemonSet on the shared bases of ``podspecs`` and
``workloadbuilders``.

Limits: no I/O here; it depends on the loader's answer (where the module is
loaded) and says nothing about ordered upgrades beyond the version label it
is gated by (that is ``kmm.operator.upgrade``). Importers use
``from kmm.operator.deviceplugin import planner as deviceplugin_planner``
(and ``builders as deviceplugin_builders``); this package re-exports nothing.
"""
