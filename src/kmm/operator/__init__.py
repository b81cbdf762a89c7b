"""The kmm operator: reconcilers for Modules and the pure object builders they send.

It never imports ``kmm.kubeletplugin`` (the node side is a separate process),
and it does not re-implement the runtime: informers, the work queue, the
controller loop and its one requeue policy, the manager and Lease election
all come from ``kmm.runtime``; Module models, validation, names and kernel
mapping from ``kmm.api``. Import modules, not names.

Pure (no I/O, table-tested):

- ``objects``: owner references and the ``SPEC_HASH`` stamp of desired objects;
- ``loaderbuilders`` / ``devicepluginbuilders``: the DaemonSets;
- ``moduleloader`` / ``deviceplugin``: per-Module plans (what to apply,
  delete, where the module is ready);
- ``nodelabels``: node label changes; ``status``: status and conditions;
- ``events``: Event bodies; ``caches``: projections, indexes, event -> key maps.

With I/O:

- ``writing``: every API write, and ``Pending`` (writes the cache has not
  shown yet, so a lagging cache causes no repeat);
- ``reconciler``: the Module reconciler tying the above together;
- ``wiring``: informers + controller + manager (``Operator``);
- ``running``: the process (metrics, probes, write counter); ``metrics``,
  ``probes``, ``jsonlogs`` its parts.

Not here (DESIGN §5, other issues): ordered upgrades and the DRA reconciler.
"""
