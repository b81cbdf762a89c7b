"""Kernel-mapping match time per node: Python's ``re`` (before) beside RE2 (after).

Run: ``.venv/bin/python bench/bench_regexps.py [--limit SECONDS] [--nodes N]``

For each pattern, the time one node's kernel takes to match, as the operator
pays it per distinct kernel of a reconcile: with Python's ``re`` (what kmm
used before), and with ``kmm.api.regexps`` (RE2, compiled once and cached, as
the operator has it; the compile is timed separately). A backtracking match
can run for hours, so each ``re`` match runs in a child process and is
stopped at ``--limit`` seconds ("> limit" is printed). Both run in this one
script, on the same kernels, so the ratio holds on a noisy machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import time

from kmm.api import regexps

RHEL = "5.14.0-427.13.1.el9_4.x86_64"
GENERIC_22 = "6" * 22  # a kernel of digits only: no "-generic", no match
CASES = (
    ("plain", r"^5\.14\.0-\d+\.el9_\d+\.x86_64$", RHEL),
    ("nested-plus", r"(([\w.]+)+)+!", RHEL),
    ("alternation-plus", r"^(\d+|\d+\.?)+-generic$", GENERIC_22),
)


def _python_match(pattern: str, kernel: str) -> None:
    re.search(pattern, kernel)


def python_seconds(pattern: str, kernel: str, limit: float) -> float | None:
    """Seconds one ``re.search`` takes (fresh compile excluded), or None past ``limit``."""
    re.compile(pattern)
    child = multiprocessing.Process(target=_python_match, args=(pattern, kernel))
    start = time.perf_counter()
    child.start()
    child.join(limit)
    elapsed = time.perf_counter() - start
    if child.is_alive():
        child.kill()
        child.join()
        return None
    # Process start-up is not the match: time a run in-process when it is short.
    if elapsed < 1.0:
        start = time.perf_counter()
        for _ in range(100):
            re.search(pattern, kernel)
        return (time.perf_counter() - start) / 100
    return elapsed


def re2_seconds(pattern: str, kernel: str, nodes: int) -> tuple[float, float]:
    """(compile seconds, per-node match seconds) with kmm's RE2 engine."""
    start = time.perf_counter()
    compiled = regexps.compile(pattern)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(nodes):
        compiled.search(kernel)
    return compile_seconds, (time.perf_counter() - start) / nodes


def _format(seconds: float | None, limit: float) -> str:
    if seconds is None:
        return f"> {limit:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e6:.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=20.0, help="seconds per re match")
    parser.add_argument("--nodes", type=int, default=10_000, help="RE2 matches to average")
    args = parser.parse_args()
    print(f"{'pattern':18} {'kernel':30} {'re (before)':>12} {'RE2 (after)':>12} "
          f"{'RE2 compile':>12} {'before/after':>13}")  # fmt: skip
    for name, pattern, kernel in CASES:
        before = python_seconds(pattern, kernel, args.limit)
        compile_seconds, after = re2_seconds(pattern, kernel, args.nodes)
        ratio = f"> {args.limit / after:,.0f}" if before is None else f"{before / after:,.1f}"
        print(
            f"{name:18} {kernel:30} {_format(before, args.limit):>12} "
            f"{_format(after, args.limit):>12} {_format(compile_seconds, args.limit):>12} "
            f"{ratio:>13}"
        )


if __name__ == "__main__":
    main()
