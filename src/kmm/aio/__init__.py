"""Shared asyncio helpers, the bottom layer: every package may use them.

They know nothing of Kubernetes, Modules or devices. Import modules, not names:

- ``tasks``: guarded background tasks (``TaskSet``, ``guard``, ``run_until``);
- ``clocks``: the ``Clock`` seam (``LoopClock``; ``FakeClock`` for tests);
- ``backoff``: exponential retry delays with jitter (``Backoff``);
- ``ratelimits``: a token bucket (``TokenBucket``), for lookups a flood must not multiply;
- ``tlsbuffers``: the read buffer of every TLS connection, sized by a process's entry point.
"""

__all__: list[str] = []
