"""The module loader concern: where a Module's kernel module is loaded, and by what.

``planner`` (pure) groups the selected nodes into (kernel, image[, version])
pairs and answers a ``plans.Plan``: the loader DaemonSets to send or delete,
``kernel-version.full`` on selected nodes and ``.ready`` exactly where a
loader pod is Ready, plus which nodes are targeted and loaded (the other
concerns run there). ``builders`` (pure) renders one loader DaemonSet per
pair: ``modprobe`` in ``postStart``, ``modprobe -r`` in ``preStop``, the
softdep file of ``modulesLoadingOrder``.

Limits: no I/O here; the reconciler sends what the planner wants, and the
node labels of every concern are merged by ``kmm.operator.nodelabels``.
Importers use ``from kmm.operator.loader import planner as loader_planner``
(and ``builders as loader_builders``); this package re-exports nothing.
"""
