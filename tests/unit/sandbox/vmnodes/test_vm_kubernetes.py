"""What makes a VM node a Kubernetes node: the files its ESP carries, where
the guest puts them, and what each says (kmm.sandbox.vmnodes.kubernetes)."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from kmm.sandbox import addressing
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.vmnodes import esp, images, kernels, kubernetes, planning
from kmm.sandbox.vmnodes import nodes as vm

REGISTRY = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"


def _node(**changed: object) -> kubernetes.NodeFiles:
    values: dict[str, object] = {
        "name": "kmm-vm-0",
        "index": 2,
        "api_port": 6443,
        "kubelet_port": 30001,
        "healthz_port": 30002,
        "proxy_healthz_port": 30003,
        "labels": {"kmm.sandbox/kubelet": "true", "kmm.sandbox/vm": "true"},
        "ca_cert": b"CA CERTIFICATE\n",
        "kubelet_cert": b"KUBELET CERTIFICATE\n",
        "kubelet_key": b"KUBELET KEY\n",
        "proxy_cert": b"PROXY CERTIFICATE\n",
        "proxy_key": b"PROXY KEY\n",
        "pause_archive": b"PAUSE",
        **changed,
    }
    return kubernetes.NodeFiles(**values)  # type: ignore[arg-type]


def _listing(files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    lines = files["files.list"].decode().splitlines()
    return {name: (target, mode) for name, target, mode in (line.split() for line in lines)}


def test_every_file_goes_where_its_daemon_reads_it_keys_for_root_alone() -> None:
    files = kubernetes.files(_node())
    listing = _listing(files)
    assert set(listing) <= set(files)
    assert listing["containerd.toml"] == ("/etc/containerd/config.toml", "0644")
    assert listing["registry-hosts.toml"][0] == f"/etc/containerd/certs.d/{REGISTRY}/hosts.toml"
    assert listing["cni.conflist"][0] == "/etc/cni/net.d/10-kmm-sandbox.conflist"
    for name in ("kubelet.key", "kube-proxy.key", "kubelet.kubeconfig", "kube-proxy.kubeconfig"):
        assert listing[name][1] == "0600"
    # The CA's certificate and the node's own identities only.
    assert files["ca.crt"] == b"CA CERTIFICATE\n"
    assert files["kubelet.key"] == b"KUBELET KEY\n"
    # Read where they are: the archive, and the daemons' command lines.
    assert "pause.tar" not in listing
    assert "kubernetes.env" not in listing
    # The ESP takes every name.
    esp.node_env(esp.NodeSettings(name="kmm-vm-0", mac=vm.mac_address(2), files=files))


def test_kubeconfigs_name_the_api_server_on_the_fabric_not_the_guests_loopback() -> None:
    files = kubernetes.files(_node(api_port=41234))
    for identity in ("kubelet", "kube-proxy"):
        config = yaml.safe_load(files[f"{identity}.kubeconfig"])
        (cluster,) = config["clusters"]
        assert cluster["cluster"]["server"] == f"https://{addressing.GATEWAY}:41234"
        assert cluster["cluster"]["certificate-authority"] == "/etc/kubernetes/pki/ca.crt"
        (user,) = config["users"]
        assert user["user"]["client-key"] == f"/etc/kubernetes/pki/{identity}.key"


def test_the_kubelet_listens_where_the_relay_dials_the_guest() -> None:
    node = _node()
    config = json.loads(kubernetes.files(node)["kubelet-config.yaml"])
    assert config["port"] == 30001
    assert config["healthzBindAddress"] == str(addressing.node_address(2))
    assert config["healthzPort"] == 30002
    assert config["containerRuntimeEndpoint"] == f"unix://{kubernetes.CONTAINERD_SOCKET}"
    assert config["cgroupDriver"] == "systemd"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    proxy = json.loads(kubernetes.files(node)["kube-proxy-config.yaml"])
    assert proxy["healthzBindAddress"] == f"{addressing.node_address(2)}:30003"
    assert proxy["hostnameOverride"] == "kmm-vm-0"


def test_containerd_pulls_from_the_sandbox_registry_alone_with_the_guests_runc() -> None:
    files = kubernetes.files(_node())
    config = tomllib.loads(files["containerd.toml"].decode())
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": "/usr/local/bin/runc", "SystemdCgroup": True}
    assert config["grpc"]["address"] == kubernetes.CONTAINERD_SOCKET
    images_plugin = config["plugins"]["io.containerd.cri.v1.images"]
    assert images_plugin["pinned_images"]["sandbox"] == containernodes.PAUSE_IMAGE
    registry = tomllib.loads(files["registry-hosts.toml"].decode())
    assert registry["host"][f"https://{REGISTRY}"]["ca"] == "/etc/kubernetes/pki/ca.crt"
    default = tomllib.loads(files["default-hosts.toml"].decode())
    assert default["server"] == "https://127.0.0.1:1"
    conflist = json.loads(files["cni.conflist"])
    ranges = conflist["plugins"][0]["ipam"]["ranges"]
    assert ranges == [[{"subnet": str(addressing.pod_subnet(2))}]]


def test_the_daemons_command_lines_as_systemd_reads_them() -> None:
    env = kubernetes.files(_node())["kubernetes.env"].decode()
    values = dict(line.split("=", 1) for line in env.splitlines())
    kubelet = values["KMM_KUBELET_ARGS"].split()
    assert "--hostname-override=kmm-vm-0" in kubelet
    assert f"--node-ip={addressing.node_address(2)}" in kubelet
    assert "--node-labels=kmm.sandbox/kubelet=true,kmm.sandbox/vm=true" in kubelet
    assert values["KMM_PAUSE_ARCHIVE"] == "/run/kmm/node/pause.tar"
    with pytest.raises(ValueError, match="EnvironmentFile"):
        kubernetes.files(_node(labels={"a": "b c'd"}))


def test_a_guest_routes_as_a_container_nodes_namespace_does() -> None:
    found = planning.routes(2, range(4))
    assert found[0] == (str(addressing.SERVICE_NETWORK), "")
    assert found[1:] == tuple(
        (str(addressing.pod_subnet(other)), str(addressing.node_address(other)))
        for other in (0, 1, 3)
    )


def test_the_node_setup_script_puts_each_file_where_the_list_says(tmp_path: Path) -> None:
    """The guest's loop (guest/node-setup) over files.list, run on the host
    with the node's files under a scratch root."""
    node_dir = tmp_path / "run-kmm-node"
    node_dir.mkdir()
    files = kubernetes.files(_node())
    for name, content in files.items():
        (node_dir / name).write_bytes(content)
    root = tmp_path / "root"
    listing = files["files.list"].decode().replace(" /", f" {root}/")
    (node_dir / "files.list").write_text(listing)
    script = (images.guest_dir() / "node-setup").read_text()
    loop = script[script.index('if [ -f "$node/files.list" ]') : script.index('. "$node/node.env"')]
    subprocess.run(["sh", "-c", f"set -eu\nnode={node_dir}\n{loop}"], check=True)
    assert (root / "etc/kubernetes/pki/kubelet.key").read_bytes() == b"KUBELET KEY\n"
    assert (root / "etc/kubernetes/pki/kubelet.key").stat().st_mode & 0o777 == 0o600
    assert (root / f"etc/containerd/certs.d/{REGISTRY}/hosts.toml").is_file()


def test_the_image_starts_the_nodes_daemons_only_with_kubernetes_files() -> None:
    for unit in ("kmm-containerd.service", "kmm-kubelet.service", "kmm-kube-proxy.service"):
        text = (images.guest_dir() / unit).read_text()
        assert "ConditionPathExists=/run/kmm/node/kubernetes.env" in text
    chosen = kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64"))
    assert images.image_key(chosen)  # the units are part of what keys the image
