"""Extra registry CAs: checked at start, named when bad, and handed to the operator."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import operating
from kmm.oci import client as oci_client
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
    oci_client.ssl_context(loaded)  # what a registry request will be made with


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


def test_a_revocation_list_alone_is_no_certificate(ca_file: Path, tmp_path: Path) -> None:
    # TLS loads a PEM CRL from a CA file without complaint: it adds no trust.
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.load_pem_x509_certificate(ca_file.read_bytes()).subject
    now = datetime.datetime.now(datetime.UTC)
    crl = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer)
        .last_update(now)
        .next_update(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    only_crl = tmp_path / "crl.pem"
    only_crl.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ValueError, match=r"holds no PEM certificate$") as caught:
        trust.load([only_crl])
    assert str(only_crl) in str(caught.value)
    both = tmp_path / "both.pem"
    both.write_bytes(only_crl.read_bytes() + ca_file.read_bytes())
    assert trust.load([both]) == (both,)


def test_a_truncated_certificate_is_named(ca_file: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pem"
    cut.write_bytes(ca_file.read_bytes()[:200])
    with pytest.raises(ValueError, match="holds no PEM certificate TLS accepts"):
        trust.load([cut])


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
