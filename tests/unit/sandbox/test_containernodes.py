"""Container nodes: what containerd, CNI, the kubelet and kube-proxy are told,
which mounts a node gets, and which shims ``down`` kills."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from kmm.sandbox import addressing, cluster, errors, hostsysctls
from kmm.sandbox.containernodes import cgroups, configs
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes


def _node(tmp_path: Path, index: int = 1) -> containernodes.ContainerNode:
    return containernodes.ContainerNode(
        kubelet=kubeletnodes.KubeletNode(
            name=f"kmm-kubelet-{index}",
            directory=tmp_path / "kubelets" / str(index),
            port=10250,
            healthz_port=10248,
            cri_http_port=0,
        ),
        index=index,
        proxy_healthz_port=10256,
        cgroup_root=f"/kmm-sandbox-abcd/kmm-kubelet-{index}",
    )


def test_containerd_is_told_the_pinned_runc_the_local_pause_image_and_the_nodes_dirs(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    config = tomllib.loads(configs.containerd_config(node, runc=Path("/pinned/runc")))
    assert config["version"] == 3
    assert config["grpc"]["address"] == str(node.containerd_socket)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == "overlayfs"
    assert images["pinned_images"]["sandbox"] == containernodes.PAUSE_IMAGE
    assert images["registry"]["config_path"] == "/etc/containerd/certs.d"
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == ["/var/run/cdi"]
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"]["BinaryName"] == "/pinned/runc"
    assert runc["options"]["SystemdCgroup"] is False
    # Nothing of containerd's lands in the host's /opt.
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(str(node.root))


def test_registry_hosts_trust_the_sandbox_ca_and_send_every_other_host_nowhere(
    tmp_path: Path,
) -> None:
    files = configs.hosts_files(ca_cert=tmp_path / "ca.crt")
    registry = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
    assert set(files) == {registry, "_default"}
    sandbox = tomllib.loads(files[registry])
    assert sandbox["server"] == f"https://{registry}"
    assert sandbox["host"][f"https://{registry}"]["ca"] == str(tmp_path / "ca.crt")
    default = tomllib.loads(files["_default"])
    assert default["server"] == "https://127.0.0.1:1"
    assert list(default["host"]) == ["https://127.0.0.1:1"]


def test_pods_get_the_nodes_subnet_and_routes_to_the_sandbox_only(tmp_path: Path) -> None:
    config = configs.cni_config(_node(tmp_path, index=3))
    bridge = config["plugins"][0]
    assert bridge["type"] == "bridge"
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": str(addressing.pod_subnet(3))}]]
    routes = [route["dst"] for route in bridge["ipam"]["routes"]]
    assert routes == [str(network) for network in addressing.sandbox_networks()]
    assert "0.0.0.0/0" not in routes
    assert [plugin["type"] for plugin in config["plugins"]] == ["bridge", "portmap"]


def test_kube_proxy_leaves_host_conntrack_limits_alone(tmp_path: Path) -> None:
    node = _node(tmp_path)
    config = configs.kube_proxy_config(node, kubeconfig=tmp_path / "kubeconfig")
    assert config["mode"] == "iptables"
    assert config["clusterCIDR"] == str(addressing.POD_NETWORK)
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["min"] == 0
    timeouts = {k: v for k, v in config["conntrack"].items() if k.endswith("Timeout")}
    assert timeouts
    assert set(timeouts.values()) == {"0s"}
    assert config["healthzBindAddress"] == f"127.0.0.1:{node.proxy_healthz_port}"
    assert config["metricsBindAddress"].startswith("127.0.0.1:")


def test_the_kubelet_runs_on_containerd_under_the_sandboxs_cgroup(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.make_dirs()
    config = configs.kubelet_config(node, ca_cert=tmp_path / "ca.crt")
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == node.cgroup_root
    assert config["cgroupsPerQOS"] is True
    resolv = Path(config["resolvConf"]).read_text()
    assert "nameserver" not in resolv.replace("no name server", "")


def test_every_fixed_path_is_the_nodes_own_and_no_host_directory_is_made(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    plan = containernodes.mount_plan(node)
    assert [target for _, target in plan.binds] == list(containernodes.MOUNTED)
    for source, target in plan.binds:
        assert source == node.root / target.lstrip("/")
    # A mount point missing on the host gets its place from an overlay on its
    # nearest existing parent (upper layer in the node's directory).
    missing = [Path(os.path.realpath(t)) for t in containernodes.MOUNTED if not Path(t).is_dir()]
    overlays = [Path(o) for o in plan.overlays]
    assert Path("/") not in overlays
    for target in missing:
        assert any(overlay in target.parents for overlay in overlays)
    script = containernodes.mount_script(node, plan)
    assert script.splitlines()[-1] == "mount --make-rshared /"


def test_a_sandbox_dir_a_node_would_mount_over_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.SandboxError, match="/var/lib/containerd"):
        containernodes.check_directory(Path("/var/lib/containerd/sandbox"))
    with pytest.raises(errors.SandboxError, match="/opt"):
        containernodes.check_directory(Path("/opt/sandbox"), ["/opt"])
    containernodes.check_directory(tmp_path)


@pytest.fixture
def fake_shims(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    # Processes whose argv is a shim's: Python, started under the shim's name.
    started = {}
    for name in ("ours", "theirs"):
        started[name] = subprocess.Popen(
            [
                str(tmp_path / "containerd-shim-runc-v2"),
                "-c",
                "import time; time.sleep(3600)",
                "-namespace",
                "k8s.io",
                "-address",
                str(tmp_path / name),
            ],
            executable=sys.executable,
        )
    try:
        yield started
    finally:
        for process in started.values():
            process.kill()
            process.wait()


def test_kill_shims_kills_the_shims_of_one_containerd_only(
    tmp_path: Path, fake_shims: dict[str, subprocess.Popen[bytes]]
) -> None:
    killed = cgroups.kill_shims(tmp_path / "ours")
    assert killed == [fake_shims["ours"].pid]
    # Gone already when it returns (a zombie until this parent reaps it):
    # down's promise that no shim outlives it.
    stat = Path(f"/proc/{killed[0]}/stat").read_text()
    assert stat[stat.rindex(")") + 2] == "Z"
    assert fake_shims["ours"].wait(timeout=10) == -9
    assert fake_shims["theirs"].poll() is None


def test_node_json_tells_a_container_node_from_a_fake_one(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.make_dirs()
    containernodes.save(node)
    assert containernodes.load(node.directory) == node
    assert kubeletnodes.load(node.directory).port == node.kubelet.port
    json_text = (node.directory / "node.json").read_text()
    assert json.loads(json_text)["runtime"] == "containerd"
    fake = kubeletnodes.KubeletNode("f", tmp_path / "fake", 1, 2, 3)
    fake.make_dirs()
    kubeletnodes.save(fake)
    assert containernodes.load(fake.directory) is None


async def test_up_refuses_a_sandbox_dir_a_node_would_mount_over_before_starting_anything(
    tmp_path: Path,
) -> None:
    options = cluster.Options(
        directory=Path("/etc/containerd/kmm-sandbox"),
        cache_dir=tmp_path / "cache",
        nodes=0,
        kubelet_nodes=1,
        runtime="containerd",
    )
    with pytest.raises(errors.SandboxError, match="may not live under /etc/containerd"):
        await cluster.up(options)
    assert not (tmp_path / "cache").exists()


def test_down_writes_the_sysctls_back_even_when_the_cgroups_would_not_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = cluster.state.SandboxState(
        directory=tmp_path,
        server="https://127.0.0.1:1",
        kubeconfig=tmp_path / "kubeconfig",
        launched=[],
        node_names=[],
        versions={},
        kubelet_nodes=["kmm-kubelet-0"],
        container_nodes=["kmm-kubelet-0"],
        cgroup_parent="kmm-sandbox-test",
    )
    cluster.state.save(record)
    released: list[Path] = []
    monkeypatch.setattr(hostsysctls, "release", released.append)

    def stuck(parent: str) -> list[Path]:
        return [Path("/sys/fs/cgroup/pids") / parent.lstrip("/")]

    monkeypatch.setattr(cgroups, "remove_cgroups", stuck)
    with pytest.raises(errors.SandboxError, match="could not remove the sandbox's cgroups"):
        cluster.down(tmp_path)
    assert released == [tmp_path]
