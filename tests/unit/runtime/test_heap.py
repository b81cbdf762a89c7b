"""``heap.trim``: a list's freed pages go back to the system, and the
operator trims after each list of its large informers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kmm.kube import client, kubeconfigs
from kmm.operator import wiring
from kmm.runtime import heap

# In a fresh process, so that nothing else of the test run moves its size:
# 40 MiB of 2,000-byte blocks (above CPython's small-object allocator: glibc
# malloc's), one in a hundred kept (a list's projections), the rest freed.
_PROBE = """
from kmm.runtime import heap
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])
blocks = [bytearray(2000) for _ in range(20000)]
kept = blocks[::100]
del blocks
freed = rss()
print(heap.trim(), freed, rss())
"""


def test_a_trim_gives_freed_heap_pages_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    )
    trimmed, before, after = done.stdout.split()
    assert trimmed == "True"
    # Freed but mapped: ~38 MiB; glibc without a trim keeps nearly all of it.
    assert int(before) - int(after) > 30 * 1024, done.stdout


async def test_the_operator_trims_after_each_list_of_nodes_pods_and_claims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1) is None)
    api = client.Client(kubeconfigs.Access(server="https://127.0.0.1:9", source="test"))
    try:
        operator = wiring.Operator(api)
        for informer in (operator.nodes, operator.pods, operator.claims):
            informer.replace([], "1")
        assert len(trims) == 3
        operator.modules.replace([], "1")  # small: no trim
        assert len(trims) == 3
    finally:
        await api.close()
