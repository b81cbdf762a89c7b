"""A small controller runtime: informers, work queue, controller loop, manager,
Lease leader election.

It knows nothing of Modules and never imports ``kmm.api`` (import-linter
enforces it). Import its modules, not their names::

    from kmm.runtime import controllers, informers, listwatch, manager

Modules, one concept each:

- ``clocks``: the `Clock` seam (`LoopClock`, `FakeClock` for tests);
- ``tasks``: guarded background tasks (`TaskSet`, `run_until`, `wait_first`);
- ``stores``: the cache (`Store`, keys, index functions, `keep_fields` projections);
- ``listwatch``: list/watch over any generated list method (`ApiListWatch`);
- ``informers``: list then watch into a store, with event handlers (`Informer`);
- ``handlers``: informer events to work-queue keys;
- ``workqueue``: dedup, per-key exclusivity, backoff, rate limit (`WorkQueue`);
- ``controllers``: `Reconciler`, `Result`, `TerminalError`, the requeue policy
  (`decide`) and the worker loop (`Controller`);
- ``leaderelection``: Lease election (`LeaderElector`, `ApiLeases`, `MemoryLeases`);
- ``manager``: runs it all, caches first, controllers only while leading;
- ``writes``: counts API writes, for "a no-op reconcile writes nothing" tests.
"""

__all__: list[str] = []
