"""The sandbox's helm and kubectl for tests: built (cached) like its other
binaries, run with a home of their own so no test reads or writes the user's
Helm configuration or kubectl cache."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from kmm.api import chart
from kmm.cli import paths
from kmm.sandbox import building, components

CHART = Path(__file__).resolve().parents[2] / "deploy" / chart.DIRECTORY


def binary(tool: components.GoTool) -> Path:
    (path,) = asyncio.run(building.ensure_built(paths.cache_dir(), (tool,))).values()
    return path


def environment(home: Path, **extra: str) -> dict[str, str]:
    """The process environment with HOME (and Helm's own dirs) under ``home``,
    and no $KUBECONFIG but one in ``extra``: a cluster is named, never found."""
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["HOME"] = str(home)
    for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[name] = str(home / name.lower())
    return {**env, **extra}


def helm(helm_path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(home),
        check=False,
    )


def template(helm_path: Path, home: Path, namespace: str, *args: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``args`` (``--set ...``): the objects."""
    done = helm(helm_path, home, "template", "kmm", str(CHART), "--namespace", namespace, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds
