"""The module loader concern: where a Module's kernel module is loaded, and by what.

``planner`` (pure) groups the selected nodes into (kernel, image[, version])
pairs and answers a ``plans.Plan``: the loader DaemonSets to send or delete,
``kernel-version.full`` on selected nodes and ``.ready`` exactly where a
loader pod is Ready, plus which nodes are targeted and loaded (the other
concerns run there) and where a load failed. ``builders`` (pure) renders one
loader DaemonSet per pair: ``modprobe`` in ``postStart``, ``modprobe -r`` in
``preStop``, the softdep file of ``modulesLoadingOrder``, each hook a
``scripts`` script (POSIX shell, run in the Module's image) that checks what
the kernel holds (``buildids``: the GNU build-ids of the kernel's module
and the image's ``.ko``) and writes why it failed to the container's
termination message; ``reports`` reads that message back into the Module's
``ModuleLoadFailed``.

Limits: no I/O here; the reconciler sends what the planner wants, and the
node labels of every concern are merged by ``kmm.operator.nodelabels``.
Importers use ``from kmm.operator.loader import planner as loader_planner``
(and ``builders as loader_builders``); this package re-exports nothing.
"""
