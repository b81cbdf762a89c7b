"""Sandbox figures: cold build, warm ``up`` to all nodes Ready, control-plane memory.

    .venv/bin/python bench/bench_sandbox.py [--runs 3] [--nodes 3] [--cold]

``--cold`` first builds every binary into an empty cache with an empty Go
build cache (module downloads stay cached: they are network, not build). The
warm runs then start and stop a sandbox ``--runs`` times. Times are wall clock
on a shared machine: read them as orders of magnitude, not as thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from kmm.sandbox import building, cluster


async def _cold_build(cache: Path) -> float:
    started = time.monotonic()
    await building.ensure_built(cache)
    return time.monotonic() - started


async def _warm_up(cache: Path, directory: Path, nodes: int) -> tuple[float, dict[str, int]]:
    started = time.monotonic()
    record = await cluster.up(cluster.Options(directory=directory, cache_dir=cache, nodes=nodes))
    elapsed = time.monotonic() - started
    try:
        rss = {process.name: process.rss_bytes() for process in record.launched}
    finally:
        cluster.down(directory)
    return elapsed, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cold", action="store_true")
    arguments = parser.parse_args()

    cache = Path(os.environ.get("KMM_CACHE_DIR", Path.home() / ".cache" / "kmm"))
    with tempfile.TemporaryDirectory(prefix="kmm-bench-") as scratch:
        if arguments.cold:
            cache = Path(scratch) / "cache"
            os.environ["GOCACHE"] = str(Path(scratch) / "gocache")
            seconds = asyncio.run(_cold_build(cache))
            print(f"cold build of all binaries: {seconds / 60:.1f} min")
        times = []
        rss: dict[str, int] = {}
        for run in range(arguments.runs):
            elapsed, rss = asyncio.run(
                _warm_up(cache, Path(scratch) / f"run-{run}", arguments.nodes)
            )
            times.append(elapsed)
        print(
            f"warm up to {arguments.nodes} nodes Ready: median {statistics.median(times):.1f} s "
            f"(runs: {', '.join(f'{t:.1f}' for t in times)})"
        )
        for name, value in rss.items():
            print(f"  RSS {name:<24} {value / 2**20:6.0f} MiB")
        print(f"  RSS control plane total    {sum(rss.values()) / 2**20:6.0f} MiB")


if __name__ == "__main__":
    main()
