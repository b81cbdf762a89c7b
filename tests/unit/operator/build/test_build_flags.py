"""``kmm operator``'s build flags reach the operator's settings; a bad
``--registry-endpoint`` is refused naming the flag, before anything runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import operating
from kmm.kube import counting
from kmm.operator import metrics
from kmm.operator.build import settings as build_settings
from kmm.sandbox import pki


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return pki.create(tmp_path_factory.mktemp("pki"), ()).ca_cert.read_bytes()


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[Any, list[Any]]:
    seen: list[Any] = []

    async def main(api: Any, settings: Any) -> None:
        seen.append(settings)
        await api.close()

    monkeypatch.setattr(operating, "_main", main)
    result = CliRunner().invoke(
        cli.build("operator"),
        ["operator", "--kubeconfig", str(_kubeconfig(tmp_path)), *flags],
        env={"POD_NAME": "p", "POD_NAMESPACE": "n", "COLUMNS": "300", **dict(os.environ)},
    )
    return result, seen


def test_the_build_flags_reach_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen = _run(
        tmp_path, monkeypatch,
        "--registry-endpoint", "10.253.0.1:5000=127.0.0.1:4000",
        "--registry-endpoint", "quay.io=127.0.0.1:4001",
        "--builder-image", "r.io/builder:2",
        "--driver-toolkit-image", "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}",
        "--build-pod-retention", "30",
        "--build-input-poll", "2.5",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.registry_endpoints == {
        "10.253.0.1:5000": "127.0.0.1:4000",
        "quay.io": "127.0.0.1:4001",
    }
    assert settings.builder_image == "r.io/builder:2"
    assert settings.driver_toolkit_image == (
        "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}"
    )
    assert (settings.build_pod_retention, settings.build_input_poll) == (30.0, 2.5)


def test_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = _run(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.builder_image == build_settings.DEFAULT_BUILDER_IMAGE
    assert settings.driver_toolkit_image == ""  # no DTK_AUTO
    assert (settings.build_pod_retention, settings.build_input_poll) == (0.0, 10.0)
    assert settings.registry_endpoints == {}


def test_a_malformed_endpoint_is_refused_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen = _run(tmp_path, monkeypatch, "--registry-endpoint", "10.253.0.1:5000")
    assert seen == []
    assert result.exit_code == 2
    assert "--registry-endpoint" in result.output
    assert "HOST=ENDPOINT" in result.output


def test_a_driver_toolkit_template_without_a_tag_is_refused_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen = _run(tmp_path, monkeypatch, "--driver-toolkit-image", "r.io/dtk")
    assert seen == []
    assert result.exit_code == 2
    assert "--driver-toolkit-image" in result.output
    assert "explicit tag" in " ".join(result.output.split())


def test_registry_requests_and_checks_are_metrics() -> None:
    registry = metrics.OperatorMetrics(
        counting.RequestCounter(),
        leading=lambda: True,
        cached=dict,
        registry_counts=lambda: (3, {"Exists": 2, "Missing": 1}),
    )
    text = registry.render().decode()
    assert "kmm_registry_requests_total 3.0" in text
    assert 'kmm_registry_checks_total{outcome="Exists"} 2.0' in text
    assert 'kmm_registry_checks_total{outcome="Missing"} 1.0' in text


def test_a_registry_ca_too_large_for_a_pod_annotation_is_refused_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ca_pem: bytes
) -> None:
    fits = tmp_path / "fits"
    fits.mkdir()
    (fits / "ca.crt").write_bytes(ca_pem)
    result, seen = _run(tmp_path, monkeypatch, "--registry-ca", str(fits))
    assert result.exit_code == 0, result.output
    # The same certificate many times: a valid bundle, over the limit.
    large = tmp_path / "large.crt"
    large.write_bytes(ca_pem * (build_settings.MAX_REGISTRY_CA // len(ca_pem) + 1))
    result, seen = _run(tmp_path, monkeypatch, "--registry-ca", str(large))
    assert seen == []
    assert result.exit_code == 2
    assert "--registry-ca" in result.output
    assert "pod annotation" in " ".join(result.output.split())
    with pytest.raises(ValueError, match="at most 245760 bytes"):
        build_settings.Settings(registry_ca=large.read_text())
