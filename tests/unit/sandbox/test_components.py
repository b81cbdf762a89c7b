"""Pins are read from the committed go.mod files, and the cache key follows them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from kmm.sandbox import components


def test_versions_come_from_the_pinned_go_mod_files() -> None:
    assert components.KUBERNETES.version == "v1.35.4"
    assert components.ETCD.version.startswith("v3.6.")
    assert components.KWOK.version == "v0.8.0"


def test_every_staging_module_is_replaced_with_the_kubernetes_version() -> None:
    go_mod = (components.KUBERNETES.directory / "go.mod").read_text()
    replaced = [line.split() for line in go_mod.splitlines() if "=>" in line]
    assert len(replaced) >= 30
    staging_version = "v0" + components.KUBERNETES.version[2:]
    for module, arrow, target, version in replaced:
        assert arrow == "=>"
        assert module == target
        assert module.startswith("k8s.io/")
        assert version == staging_version


def test_cache_key_changes_when_go_sum_changes(tmp_path: Path) -> None:
    copy = tmp_path / "etcd"
    shutil.copytree(components.ETCD.directory, copy)
    tool = dataclasses.replace(components.ETCD, directory=copy)
    before = tool.cache_key
    assert before.startswith(f"etcd-{tool.version}-")
    with (copy / "go.sum").open("a") as stream:
        stream.write("example.com/changed v1.0.0 h1:AAAA=\n")
    assert tool.cache_key != before
