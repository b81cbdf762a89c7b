"""A small controller runtime: informers, work queue, controller loop, manager,
Lease leader election.

It knows nothing of Modules and never imports ``kmm.api`` (import-linter
enforces it). It speaks to the API server only through ``kmm.kube`` (list,
watch and the reflector loop live there, shared with the kubelet plugin) and
takes its clocks and tasks from ``kmm.aio``. Import its modules, not their
names::

    from kmm.runtime import controllers, informers, manager

Modules, one concept each:

- ``stores``: the cache (`Store`, keys, index functions, `keep_fields` projections);
- ``informers``: a `kube.reflecting.Reflector` into a store, with event handlers (`Informer`);
- ``handlers``: informer events to work-queue keys;
- ``workqueue``: dedup, per-key exclusivity, backoff, rate limit (`WorkQueue`);
- ``controllers``: `Reconciler`, `Result`, `TerminalError`, the requeue policy
  (`decide`) and the worker loop (`Controller`);
- ``leaderelection``: Lease election (`LeaderElector`, `ApiLeases`, `MemoryLeases`);
- ``manager``: runs it all, caches first, controllers only while leading.
"""

__all__: list[str] = []
