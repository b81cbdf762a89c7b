"""The DRA concern: a Module's ``spec.dra`` driver DaemonSet, target labels and DeviceClasses.

``planner`` (pure) wants the DRA driver DaemonSet(s), ``.dra-target`` on the
selected nodes the Module may schedule on (held by ResourceClaims in use),
``.dra-ready`` where the driver pod is Ready, and the Module's DeviceClasses
(never taking over a class that is not the Module's). ``builders`` (pure)
renders the DaemonSet, with the layout DRA driver images expect, and the
DeviceClasses.

Limits: no I/O here; it is a planner in the Module reconcile, not a
controller of its own, so its labels are merged with the loader's and the
upgrade's in one patch per node. Importers use
``from kmm.operator.dra import planner as dra_planner`` (and
``builders as dra_builders``); this package re-exports nothing.
"""
