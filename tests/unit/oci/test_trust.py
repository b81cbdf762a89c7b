"""Extra registry CAs: checked at start, named when bad, and handed to the operator."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import operating
from kmm.oci import trust
from kmm.sandbox import pki


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pki.create(tmp_path_factory.mktemp("pki"), ()).ca_cert


def test_a_file_and_a_mounted_configmap_directory(ca_file: Path, tmp_path: Path) -> None:
    # A ConfigMap volume: keys are symlinks into ..data, a symlink to a dated directory.
    dated = tmp_path / "cas" / "..2026_12_02_06_00_00.1"
    dated.mkdir(parents=True)
    (dated / "ca.crt").write_bytes(ca_file.read_bytes())
    (dated / "other.pem").write_bytes(ca_file.read_bytes())
    (tmp_path / "cas" / "..data").symlink_to(dated.name)
    for key in ("ca.crt", "other.pem"):
        (tmp_path / "cas" / key).symlink_to(Path("..data") / key)
    loaded = trust.load([ca_file, tmp_path / "cas"])
    assert loaded == (ca_file, tmp_path / "cas" / "ca.crt", tmp_path / "cas" / "other.pem")
    trust.ssl_context(loaded)  # what a registry request will be made with


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "holds no PEM certificate"),
        (
            b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
            "holds no PEM certificate",
        ),
        (b"just text", "holds no PEM certificate"),
    ],
)
def test_a_file_without_a_certificate_is_named(
    tmp_path: Path, content: bytes, message: str
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        trust.load([bad])
    assert str(bad) in str(caught.value)


def test_missing_paths_and_empty_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        trust.load([tmp_path / "absent.pem"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="directory without certificate files"):
        trust.load([tmp_path / "empty"])


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_the_operator_refuses_a_bad_ca_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []

    async def main(api: Any, settings: Any) -> None:
        started.append(settings)
        await api.close()

    # The operator itself is not run: it must not have been reached.
    monkeypatch.setattr(operating, "_main", main)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    result = CliRunner().invoke(
        cli.build("operator"),
        ["operator", "--kubeconfig", str(_kubeconfig(tmp_path)), "--registry-ca", str(bad)],
        env={"COLUMNS": "300"},
    )
    assert started == []
    assert result.exit_code == 2
    assert "--registry-ca" in result.output
    assert "holds no PEM certificate" in result.output


def test_the_operator_keeps_the_cas_on_its_settings(
    ca_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    async def main(api: Any, settings: Any) -> None:
        seen.append(settings)
        await api.close()

    monkeypatch.setattr(operating, "_main", main)
    result = CliRunner().invoke(
        cli.build("operator"),
        ["operator", "--kubeconfig", str(_kubeconfig(tmp_path)), "--registry-ca", str(ca_file)],
        env={"POD_NAME": "p", "POD_NAMESPACE": "n", **dict(os.environ)},
    )
    assert result.exit_code == 0, result.output
    assert seen[0].registry_ca_files == (ca_file,)


def test_the_operator_help_says_what_the_cas_are_for() -> None:
    result = CliRunner().invoke(
        cli.build("operator"), ["operator", "--help"], env={"COLUMNS": "300"}
    )
    assert "--registry-ca" in result.output
    assert "registry requests" in result.output
