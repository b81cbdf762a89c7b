"""Shared by the container-node tests (no tests here): a sandbox of their
own with container nodes, and ``kmm sandbox push`` run as a user runs it.

- ``started``: ``kmm sandbox up --runtime containerd`` with the pause image
  ``make test-images`` made, in a short directory under /tmp (the kubelet's
  unix sockets live under it), taken down and removed afterwards;
- ``push``: an OCI archive into that sandbox's registry through the CLI;
  the reference it printed last (``10.253.0.1:5000/NAME:TAG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import compatibility

from kmm.cli import paths
from kmm.sandbox import cluster

IMAGES = Path("build/images")
_KMM = Path(sys.executable).with_name("kmm")


@contextlib.contextmanager
def started(prefix: str, **options: Any) -> Iterator[cluster.state.SandboxState]:
    """A running sandbox with ``options`` (``cluster.Options`` fields; no KWOK
    node unless ``nodes`` says otherwise), gone after the block."""
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    chosen: dict[str, Any] = {
        "nodes": 0,
        "runtime": "containerd",
        "pause_image": (IMAGES / "pause.tar").resolve(),
        "kubernetes_version": compatibility.version(),
        **options,
    }
    try:
        record = asyncio.run(
            cluster.up(cluster.Options(directory=directory, cache_dir=paths.cache_dir(), **chosen))
        )
        yield record
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def push(directory: Path, archive: Path, name_tag: str) -> str:
    """``kmm sandbox push --dir DIRECTORY ARCHIVE NAME:TAG``; its last line."""
    done = subprocess.run(
        [str(_KMM), "sandbox", "push", "--dir", str(directory), str(archive.resolve()), name_tag],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]
