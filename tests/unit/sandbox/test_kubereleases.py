"""The release table: which release a flag names, and what each release's
components are started with (a gate a release does not know stops it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kmm.api import installation
from kmm.sandbox import cluster, components, controlplane, kubeletconfigs, kubereleases, pki

OLDEST, MIDDLE, NEWEST = (kubereleases.RELEASES[minor] for minor in ("1.35", "1.36", "1.37"))


@pytest.mark.parametrize(
    ("asked", "minor"),
    [("", "1.37"), ("1.35", "1.35"), ("1.36.3", "1.36"), ("v1.37.2", "1.37"), (" 1.37 ", "1.37")],
)
def test_a_minor_or_its_pinned_patch_names_a_release(asked: str, minor: str) -> None:
    assert kubereleases.find(asked).minor == minor


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ("1.34", "supported are 1.35, 1.36, 1.37"),
        ("1.38.0", "supported are 1.35, 1.36, 1.37"),
        ("latest", "supported are 1.35, 1.36, 1.37"),
        ("1.37.1", "kmm pins v1.37.2 for 1.37; other patches are not built"),
    ],
)
def test_other_versions_are_refused_naming_the_flag(asked: str, message: str) -> None:
    with pytest.raises(ValueError, match="--kubernetes-version") as raised:
        kubereleases.find(asked)
    assert message in str(raised.value)


def test_the_default_is_the_newest_wrapper() -> None:
    """scripts/build_test_images.sh takes the pause source from the newest
    wrapper directory, standing for the default release's."""
    directories = sorted(
        (path.name for path in (components.tools_dir() / "kubernetes").iterdir()),
        key=lambda name: tuple(int(part) for part in name[1:].split(".")),
    )
    assert directories == [f"v{minor}" for minor in kubereleases.RELEASES]
    assert directories[-1] == kubereleases.DEFAULT.directory_name
    assert kubereleases.DEFAULT.version == "v1.37.2"


def test_a_known_commit_is_a_full_sha() -> None:
    for release in kubereleases.RELEASES.values():
        assert re.fullmatch(r"[0-9a-f]{40}|", release.commit)


def test_feature_gates_become_one_sorted_flag() -> None:
    assert kubereleases.flag({}) == []
    assert kubereleases.flag({"B": False, "A": True}) == ["--feature-gates=A=true,B=false"]


def _apiserver(release: kubereleases.Release) -> list[str]:
    credentials = pki.Pki(Path("/nowhere"))
    return controlplane.apiserver_argv(
        Path("kube-apiserver"), credentials, 1, 2, gates=release.gates
    )


def test_resource_health_is_switched_on_where_it_is_off_by_default() -> None:
    """Alpha in 1.35 (off): the API server and the kubelets are told; beta and
    on from 1.36, where naming it is not needed."""
    assert "--feature-gates=ResourceHealthStatus=true" in _apiserver(OLDEST)
    assert OLDEST.gates.kubelet == {"ResourceHealthStatus": True}
    for release in (MIDDLE, NEWEST):
        assert not any(flag.startswith("--feature-gates") for flag in _apiserver(release))
        assert release.gates.kubelet == {}


def test_device_taints_are_left_at_each_releases_default() -> None:
    """GA in 1.37; 1.35 and 1.36 run as a cluster of theirs does, off."""
    for release in kubereleases.RELEASES.values():
        for gates in (
            release.gates.apiserver,
            release.gates.controller_manager,
            release.gates.scheduler,
            release.gates.kubelet,
        ):
            assert not {"DRADeviceTaints", "DRADeviceTaintRules"} & set(gates)


def test_the_kubelet_config_carries_the_releases_gates() -> None:
    shared = {"port": 1, "healthz_address": "127.0.0.1", "healthz_port": 2, "client_ca": "ca"}
    configured = kubeletconfigs.base(**shared, feature_gates=OLDEST.gates.kubelet)  # type: ignore[arg-type]
    assert configured["featureGates"] == {"ResourceHealthStatus": True}
    assert "featureGates" not in kubeletconfigs.base(**shared)  # type: ignore[arg-type]


def _options(**fields: object) -> cluster.Options:
    return cluster.Options(directory=Path("/nowhere"), cache_dir=Path("/nowhere"), **fields)  # type: ignore[arg-type]


def test_options_name_their_release_and_vm_nodes_need_the_default() -> None:
    assert _options().release == kubereleases.DEFAULT
    assert _options(kubernetes_version="1.36").release == MIDDLE
    _options(kubernetes_version="1.37", vm_nodes=1).check()
    with pytest.raises(ValueError, match="VM nodes run the node image's kubelet"):
        _options(kubernetes_version="1.35", vm_nodes=1).check()
    with pytest.raises(ValueError, match="supported are"):
        _options(kubernetes_version="2.0").check()


def test_a_sandbox_of_an_older_release_builds_that_releases_binaries() -> None:
    chosen = _options(kubernetes_version="1.35", kubelet_nodes=1, runtime="containerd")
    built = cluster._tools(chosen)
    kubernetes_tools = [tool for tool in built if tool.directory.parent.name == "kubernetes"]
    assert {tool.name for tool in kubernetes_tools} == {
        "kubernetes",
        "kubectl",
        "kubelet",
        "kube-proxy",
    }
    assert {tool.version for tool in kubernetes_tools} == {OLDEST.version}


def test_the_tested_range_the_chart_states_is_the_sandboxs() -> None:
    """What the chart and the install page state is what tests run."""
    assert (
        min(kubereleases.RELEASES),
        max(kubereleases.RELEASES),
    ) == installation.KUBERNETES_TESTED


def test_a_sandbox_advertising_loopback_publishes_no_kubernetes_endpoint() -> None:
    """1.37's API server refuses to advertise 127.0.0.1 through the endpoint
    reconciler (the `kubernetes` Service's endpoint); a sandbox without
    node namespaces has no other address, and nothing dials that Service."""
    argv = _apiserver(NEWEST)
    assert "--advertise-address=127.0.0.1" in argv
    assert "--endpoint-reconciler-type=none" in argv
