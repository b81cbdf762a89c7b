"""Kubelet nodes: what the kubelet is told, and what keeps it inside the sandbox dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kmm.sandbox import cluster, errors, namespaces
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes


def _node(tmp_path: Path) -> kubeletnodes.KubeletNode:
    return kubeletnodes.KubeletNode(
        name="kmm-kubelet-0",
        directory=tmp_path / "kubelets" / "0",
        port=10250,
        healthz_port=10248,
        cri_http_port=10300,
    )


def test_config_keeps_the_kubelet_off_cgroups_iptables_and_anonymous_callers(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    node.make_dirs()
    config = json.loads(kubeletnodes.write_config(node, ca_cert=tmp_path / "ca.crt").read_text())
    assert config["failCgroupV1"] is False
    assert config["cgroupsPerQOS"] is False
    assert config["enforceNodeAllocatable"] == []
    assert config["failSwapOn"] is False
    assert config["makeIPTablesUtilChains"] is False
    # Inside the node's namespace: every address of its own, none of the host's.
    assert config["address"] == "0.0.0.0"
    assert config["healthzBindAddress"] == "127.0.0.1"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["podLogsDir"].startswith(str(node.root))
    assert config["containerRuntimeEndpoint"] == f"unix://{node.cri_socket}"


def test_the_kubelet_runs_in_its_nodes_namespaces(tmp_path: Path) -> None:
    node = _node(tmp_path)
    argv = kubeletnodes.kubelet_argv(
        Path("/bin/kubelet"),
        node,
        holder=namespaces.Holder(pid=4242, mount=True),
        kubeconfig=tmp_path / "kubeconfig",
        config=tmp_path / "config",
        address="10.253.0.10",
        labels={"a": "b"},
    )
    assert argv[1:4] == ["--target=4242", "--net", "--mount"]
    kubelet = argv[4:]
    assert kubelet[0] == "/bin/kubelet"
    assert f"--root-dir={node.kubelet_dir}" in kubelet
    assert f"--cert-dir={node.kubelet_dir / 'pki'}" in kubelet
    assert "--node-ip=10.253.0.10" in kubelet


@pytest.mark.parametrize("directory", ["/var/lib/kmm", "/var/log/sandbox", "/tmp/" + "d" * 60])
def test_directories_the_kubelet_cannot_use_are_refused(directory: str) -> None:
    with pytest.raises(errors.SandboxError):
        kubeletnodes.check_directory(Path(directory))


def test_a_short_directory_is_fine() -> None:
    kubeletnodes.check_directory(Path("/tmp/kmm"))


def test_node_identity_is_what_the_node_authorizer_expects() -> None:
    found = kubeletnodes.identity("kmm-kubelet-3")
    assert found.user == "system:node:kmm-kubelet-3"
    assert found.groups == ("system:nodes",)


def test_node_record_round_trips(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.make_dirs()
    kubeletnodes.save(node)
    assert kubeletnodes.load(node.directory) == node


async def test_kubelet_nodes_refuse_a_cluster_without_the_resource_api(tmp_path: Path) -> None:
    options = cluster.Options(
        directory=Path("/tmp/kmm-never-started"),
        cache_dir=tmp_path,
        kubelet_nodes=1,
        runtime_config=("resource.k8s.io/v1=false",),
    )
    with pytest.raises(ValueError, match=r"needs resource\.k8s\.io served"):
        await cluster.up(options)
    assert not options.directory.exists()
