"""The kmm operator: reconcilers for Modules (and PreflightValidations) and the pure object builders they send.

It never imports ``kmm.kubeletplugin`` (the node side is a separate process),
and it does not re-implement the runtime: informers, the work queue, the
controller loop and its one requeue policy, the manager and Lease election
all come from ``kmm.runtime``; API access from ``kmm.kube``; Module models,
validation, names and kernel mapping from ``kmm.api``. Import modules, not
names: a concern's module as ``<concern>_<module>``, e.g.
``from kmm.operator.loader import planner as loader_planner``.

A reconcile reads one ``views.ModuleView`` and asks each concern's pure
planner what it wants (``planners``; each answers a ``plans.Plan``:
DaemonSets to apply or delete, the node labels it owns); ``nodelabels``
merges their labels into one patch per node; ``reconciler`` has the senders
send it all and writes the status.

Concerns, one sub-package each (``planner`` pure, ``builders`` pure):

==================  ========================================================
``loader``          loader DaemonSets per (kernel, image[, version]); where
                    the module is loaded
``deviceplugin``    the device-plugin DaemonSet(s) and their readiness
``dra``             the DRA driver DaemonSet(s), target labels held by
                    claims in use, DeviceClasses
``upgrade``         ordered upgrades: the version labels, the action table
``build``           images built and signed in the cluster when missing
                    (asked first: the loader skips the kernels it gates)
``preflight``       PreflightValidations: per Module, whether an image
                    exists (or can be built and signed) for a kernel the
                    nodes do not run yet; its own controller, keyed by the
                    validation, beside the Module reconcile
==================  ========================================================

Shared, pure (no I/O, table-tested):

- ``views``: the read-only view of the caches (and ``Caches``, the stores
  it is read from); ``plans``: the planners' answer; ``planners``: each
  concern's planner asked in order, and what the answers say for the
  status;
- ``workloads``: what the device plugin and DRA planners share;
- ``podspecs`` (every pod) and ``workloadbuilders`` (the two device
  workloads): pod-spec bases; ``objects``: owner references and the
  ``SPEC_HASH`` stamp;
- ``nodelabels``: merging wanted labels into patches; ``status``: status
  and conditions; ``events``: Event bodies (Module and Node);
  ``caches``: projections, indexes, event -> key maps; ``ownership``:
  which cached objects are a Module's (its namespace and owners, never
  its labels alone); ``failures``: a failed reconcile step, shown on the
  Module, and a refused write (one object's, shown where it belongs while
  the rest goes ahead).

Shared, with I/O:

- ``writing``: every API write; ``inflight``: ``Pending``, the writes the
  cache has not shown yet (so a lagging cache causes no repeat);
  ``reading``: the GETs made on demand, outside the informers;
- ``podadmission``: whether admission lets in the pods of a Module's
  DaemonSets (a dry run of the template of one whose pods stay missing);
- ``boots``: which pods of those DaemonSets are Ready from an earlier boot
  of their node (memory fed by the Node and pod informers' events);
- ``reconciler``: the Module reconciler: it drives the steps, asks the
  planners, has the senders send their answers, and writes the status;
- the senders of a Module's objects, each refusal kept to its object:
  ``imagepods`` (build, sign and pull pods), ``daemonsets`` (DaemonSets,
  loader pods replaced), ``deviceclasses`` (DeviceClasses, refusals
  remembered), ``labelling`` (node label patches, ``.ready``'s Node
  Events); ``telling``: the Events they send, each refusal told once;
- ``finalizing``: a Module being deleted taken down in order before its
  finalizer goes, and what one gone from the cache left behind;
- ``nodekernels``: a node-keyed controller keeping ``kernel-version.full``
  true on nodes no Module's reconcile visits;
- ``wiring``: informers + controllers + manager (``Operator``);
- ``running``: the process (metrics and probes, served by
  ``kmm.aio.httpserving``); ``metrics`` and ``jsonlogs`` its parts;
- ``inspecting``: what an admin sees per node (``kmm status``, ``kmm upgrade``).
"""
