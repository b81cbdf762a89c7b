"""Pins are read from the committed go.mod files, and the cache key follows them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from kmm.sandbox import components, kubereleases


def test_versions_come_from_the_pinned_go_mod_files() -> None:
    assert components.KUBERNETES.version == "v1.37.2"
    assert components.ETCD.version.startswith("v3.6.")
    assert components.KWOK.version == "v0.8.0"


@pytest.mark.parametrize("minor", list(kubereleases.RELEASES))
def test_every_staging_module_is_replaced_with_the_kubernetes_version(minor: str) -> None:
    tools = components.kubernetes(kubereleases.RELEASES[minor])
    assert tools.control_plane.version.startswith(f"v{minor}.")
    go_mod = (tools.control_plane.directory / "go.mod").read_text()
    replaced = [line.split() for line in go_mod.splitlines() if "=>" in line]
    assert len(replaced) >= 30
    staging_version = "v0" + tools.control_plane.version[2:]
    for module, arrow, target, *version in replaced:
        assert arrow == "=>"
        if module == "kmm.local/sandbox/fakecri":  # the local fake CRI module
            assert (target, version) == ("../../fakecri", [])
            continue
        assert module == target
        assert module.startswith("k8s.io/")
        assert version == [staging_version]


def test_every_release_builds_its_own_binaries_from_its_own_module() -> None:
    keys = set()
    for release in kubereleases.RELEASES.values():
        tools = components.kubernetes(release)
        for tool in (tools.control_plane, tools.kubelet, tools.kube_proxy, tools.kubectl):
            assert tool.version == release.version
            assert tool.directory.name == f"v{release.minor}"
            assert tool.commit == release.commit
            keys.add(tool.cache_key)
    assert len(keys) == 4 * len(kubereleases.RELEASES)


def test_the_fake_runtime_is_part_of_the_kubelets_key(tmp_path: Path) -> None:
    copy = tmp_path / "fakecri"
    shutil.copytree(components.tools_dir() / "fakecri", copy)
    tool = dataclasses.replace(components.KUBELET, local_modules=(copy,))
    before = tool.cache_key
    assert before == components.KUBELET.cache_key
    with (copy / "main.go").open("a") as stream:
        stream.write("// changed\n")
    assert tool.cache_key != before


def test_cache_key_changes_when_go_sum_changes(tmp_path: Path) -> None:
    copy = tmp_path / "etcd"
    shutil.copytree(components.ETCD.directory, copy)
    tool = dataclasses.replace(components.ETCD, directory=copy)
    before = tool.cache_key
    assert before.startswith(f"etcd-{tool.version}-")
    with (copy / "go.sum").open("a") as stream:
        stream.write("example.com/changed v1.0.0 h1:AAAA=\n")
    assert tool.cache_key != before


def test_container_node_pins_come_from_their_go_mod_files() -> None:
    assert components.CONTAINERD.version == "v2.4.2"
    assert components.RUNC.version == "v1.5.3"
    assert components.CNI_PLUGINS.version == "v1.10.0"
    assert components.REGISTRY.version == "v3.1.2"
    # kube-proxy is the pinned Kubernetes release's, like the kubelet.
    assert components.KUBE_PROXY.version == components.KUBELET.version
    assert components.KUBE_PROXY.directory == components.KUBELET.directory
    binaries = [binary for tool in components.CONTAINER_NODE for binary in tool.binaries]
    assert sorted(binaries) == sorted(
        [
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
            "kube-proxy",
            "bridge",
            "host-local",
            "loopback",
            "portmap",
        ]
    )
    assert components.REGISTRY.binaries == ("registry",)


def test_a_version_read_from_go_mod_follows_an_edit(tmp_path: Path) -> None:
    copy = tmp_path / "runc"
    shutil.copytree(components.RUNC.directory, copy)
    tool = dataclasses.replace(components.RUNC, directory=copy)
    before = tool.cache_key
    go_mod = copy / "go.mod"
    go_mod.write_text(go_mod.read_text().replace(" v1.5.3", " v1.5.4"))
    assert tool.version == "v1.5.4"
    assert tool.cache_key.startswith("runc-v1.5.4-")
    assert tool.cache_key != before


def test_build_settings_are_part_of_the_cache_key() -> None:
    tool = components.CNI_PLUGINS
    keys = {
        tool.cache_key,
        dataclasses.replace(tool, tags=("no_btrfs",)).cache_key,
        dataclasses.replace(tool, tags=("no_btrfs", "seccomp")).cache_key,
        dataclasses.replace(tool, cgo=True).cache_key,
        dataclasses.replace(tool, cgo=None).cache_key,
        dataclasses.replace(tool, env=(("GOAMD64", "v3"),)).cache_key,
        dataclasses.replace(tool, ldflags=("-s",)).cache_key,
        dataclasses.replace(tool, stamps=()).cache_key,
        dataclasses.replace(tool, c_libraries=(("libseccomp", "libseccomp-dev"),)).cache_key,
    }
    assert len(keys) == 9


def test_tools_without_build_settings_digest_none() -> None:
    """The first tools (etcd, kwok, helm) set none, so their cache keys, and
    entries, stay what they were before the settings came in."""
    for tool in (components.ETCD, components.KWOK, components.HELM):
        assert tool.build_settings == {}, tool.name
    assert components.RUNC.build_settings["cgo"] is True
    assert components.CONTAINERD.build_settings["cgo"] is False


def test_only_runc_builds_with_cgo() -> None:
    for tool in (*components.CONTAINER_NODE, components.REGISTRY):
        assert tool.cgo is (tool is components.RUNC), tool.name
    assert "seccomp" in components.RUNC.tags
    assert ("libseccomp", "libseccomp-dev") in components.RUNC.c_libraries
    assert "no_btrfs" in components.CONTAINERD.tags
