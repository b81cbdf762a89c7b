"""A small controller runtime: informers, work queue, controller loop, manager,
Lease leader election.

It knows nothing of Modules and never imports ``kmm.api``.
"""
