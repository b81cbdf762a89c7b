"""Extra registry CAs: checked at start, named when bad, and handed to the operator."""

from __future__ import annotations

import datetime
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import operating
from kmm.oci import client as oci_client
from kmm.oci import mediatypes, transport, trust
from kmm.sandbox import pki

_DIGEST = "sha256:" + "b" * 64


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
    trust.context(loaded)  # what a registry request will be made with


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


def test_one_context_per_trust_configuration(ca_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.pem"
    other.write_bytes(ca_file.read_bytes())
    shared = trust.context([ca_file])
    assert trust.context([ca_file]) is shared
    made = transport.Transport("registry.example:5000", ca_files=[ca_file])
    assert made.tls is shared  # what every registry client asks for
    assert trust.context([other]) is not shared
    assert trust.context() is trust.context()
    assert trust.context() is not shared
    unverified = trust.context([ca_file], verify=False)
    assert unverified is trust.context(verify=False)
    assert unverified.verify_mode is ssl.CERT_NONE
    assert not unverified.check_hostname
    assert shared.verify_mode is ssl.CERT_REQUIRED


def _ders(context: ssl.SSLContext) -> list[bytes]:
    return list(context.get_ca_certs(binary_form=True))


def test_a_ca_file_changed_on_disk_makes_a_new_context(tmp_path: Path) -> None:
    # A ConfigMap volume: its key links into ..data; an update points ..data
    # at a new dated directory.
    first, second = (pki.create(tmp_path / name, ()).ca_cert for name in ("first", "second"))
    mounted = tmp_path / "cas"
    for dated, source in (("..1", first), ("..2", second)):
        (mounted / dated).mkdir(parents=True)
        (mounted / dated / "ca.crt").write_bytes(source.read_bytes())
    (mounted / "..data").symlink_to("..1")
    (mounted / "ca.crt").symlink_to(Path("..data") / "ca.crt")
    before = trust.context([mounted / "ca.crt"])
    first_der = ssl.PEM_cert_to_DER_cert(first.read_text())
    assert first_der in _ders(before)
    (mounted / "..data").unlink()
    (mounted / "..data").symlink_to("..2")
    after = trust.context([mounted / "ca.crt"])
    assert after is not before
    assert ssl.PEM_cert_to_DER_cert(second.read_text()) in _ders(after)
    assert first_der not in _ders(after)
    assert trust.context([mounted / "ca.crt"]) is after


async def test_registry_checks_make_one_context(
    ca_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each check used to load the system's roots again (~25 ms, ~1 MiB each).
    authority = pki.create(tmp_path / "pki", ())
    cert, key = pki.issue_serving(
        authority, "registry", "registry.test", dns_names=("registry.test",), ips=()
    )
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(cert, key)

    async def manifest(request: web.Request) -> web.Response:
        return web.Response(
            headers={"Content-Type": mediatypes.OCI_MANIFEST, "Docker-Content-Digest": _DIGEST}
        )

    app = web.Application()
    app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", manifest)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=serving)
    made: list[None] = []
    making = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(None)
        return making(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    try:
        for _ in range(5):
            async with oci_client.Client(
                "registry.test",
                ca_files=(authority.ca_cert,),
                endpoint=f"127.0.0.1:{server.port}",
            ) as registry:
                found = await registry.exists("kmm/mod", "v1")
                assert found is not None
                assert found.digest == _DIGEST
    finally:
        await server.close()
    assert len(made) == 1
