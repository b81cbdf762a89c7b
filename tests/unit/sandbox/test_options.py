"""What the fault options add to the API server's command line, and what they refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.sandbox import cluster


def _options(**fields: object) -> cluster.Options:
    return cluster.Options(directory=Path("/nowhere"), cache_dir=Path("/nowhere"), **fields)  # type: ignore[arg-type]


def test_defaults_add_no_flag() -> None:
    assert _options().apiserver_flags() == []


def test_compaction_interval_in_milliseconds() -> None:
    assert _options(etcd_compaction_interval=0.5).apiserver_flags() == [
        "--etcd-compaction-interval=500ms"
    ]


def test_no_watch_cache() -> None:
    assert _options(watch_cache=False, etcd_compaction_interval=1).apiserver_flags() == [
        "--etcd-compaction-interval=1000ms",
        "--watch-cache=false",
    ]


def test_an_inflight_limit_turns_priority_and_fairness_off() -> None:
    assert _options(max_requests_inflight=3).apiserver_flags() == [
        "--max-requests-inflight=3",
        "--enable-priority-and-fairness=false",
    ]
    assert _options(
        max_mutating_requests_inflight=1, runtime_config=("resource.k8s.io/v1=false",)
    ).apiserver_flags() == [
        "--runtime-config=resource.k8s.io/v1=false",
        "--max-mutating-requests-inflight=1",
        "--enable-priority-and-fairness=false",
    ]


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"etcd_compaction_interval": 0.0}, "--etcd-compaction-interval"),
        ({"max_requests_inflight": 0}, "--max-requests-inflight"),
        ({"max_mutating_requests_inflight": -1}, "--max-mutating-requests-inflight"),
        ({"nodes": -1}, "--nodes"),
        ({"fake_modules": (("foo", 1),)}, "--fake-module needs --runtime containerd"),
        (
            {
                "fake_modules": (("foo", 1), ("foo", 2)),
                "runtime": "containerd",
                "kubelet_nodes": 1,
            },
            "--fake-module: a module is named twice",
        ),
        ({"vm_nodes": -1}, "--vm-nodes must be 0 or more"),
        ({"vm_nodes": 1, "accel": "hvf"}, "--accel must be one of auto, kvm, tcg"),
        ({"node_kernel": "6.1.0-57-amd64"}, "--node-kernel needs --vm-nodes"),
        ({"secure_boot": False}, "--no-secure-boot needs --vm-nodes"),
        ({"accel": "tcg"}, "--accel tcg needs --vm-nodes"),
        ({"vm_nodes": 200, "kubelet_nodes": 41}, "together must be 240 or fewer"),
        (
            {"vm_nodes": 1, "runtime_config": ("resource.k8s.io/v1=false",)},
            r"--vm-nodes needs resource\.k8s\.io served",
        ),
    ],
)
def test_out_of_range_options_are_refused_by_flag(fields: dict[str, object], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        _options(**fields).check()


def test_vm_nodes_want_the_registry_their_pods_pull_from() -> None:
    assert _options(vm_nodes=1).wants_registry
    assert not _options(vm_nodes=1, registry=False).wants_registry
    _options(vm_nodes=2, kubelet_nodes=1, runtime="containerd", accel="tcg").check()
