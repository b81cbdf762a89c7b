"""The sandbox registry's options, config, htpasswd and credentials files,
written without starting it (its integration tests start the real one)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import bcrypt
import pytest
import yaml
from cryptography import x509

from kmm.oci import auth
from kmm.sandbox import cluster, pki, processes, registry


def _options(**fields: object) -> cluster.Options:
    return cluster.Options(directory=Path("/nowhere"), cache_dir=Path("/nowhere"), **fields)  # type: ignore[arg-type]


def test_the_registry_is_off_by_default_and_on_with_auth_or_the_flag() -> None:
    assert not _options().wants_registry
    assert _options(registry=True).wants_registry
    assert _options(registry_auth=registry.Auth("u", "p")).wants_registry


def test_auth_without_the_registry_is_refused_naming_both_flags() -> None:
    with pytest.raises(ValueError, match="--registry-auth needs the registry: drop --no-registry"):
        _options(registry=False, registry_auth=registry.Auth("u", "p")).check()


@pytest.mark.parametrize("text", ["nopassword", ":p", "u:", "a user:p"])
def test_registry_auth_must_be_user_colon_password(text: str) -> None:
    with pytest.raises(ValueError, match="--registry-auth"):
        registry.parse_auth(text)


def test_a_password_may_hold_colons() -> None:
    assert registry.parse_auth("u:a:b") == registry.Auth("u", "a:b")


def _start(tmp_path: Path, auth_: registry.Auth | None) -> tuple[list[list[str]], Path]:
    launched: list[list[str]] = []

    def launch(name: str, argv: list[str], *, health_url: str) -> processes.Process:
        launched.append(argv)
        return processes.Process(name, 0, -1, tmp_path / "log", tuple(argv), health_url)

    credentials = pki.create(tmp_path / "pki", ())
    _, record = registry.start(launch, tmp_path, Path("/bin/registry"), credentials, auth=auth_)
    assert record.reference_host == "10.253.0.1:5000"
    return launched, tmp_path / "registry"


def test_config_serves_tls_on_loopback_with_deletes_and_no_auth(tmp_path: Path) -> None:
    launched, home = _start(tmp_path, None)
    assert launched == [["/bin/registry", "serve", str(home / "config.yml")]]
    config = yaml.safe_load((home / "config.yml").read_text())
    assert config["http"]["addr"].startswith("127.0.0.1:")
    assert config["storage"]["filesystem"]["rootdirectory"] == str(home / "data")
    assert config["storage"]["delete"] == {"enabled": True}
    assert "auth" not in config
    certificate = x509.load_pem_x509_certificate(
        Path(config["http"]["tls"]["certificate"]).read_bytes()
    )
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(str(ip) for ip in names.get_values_for_type(x509.IPAddress)) == [
        "10.253.0.1",
        "127.0.0.1",
    ]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]


def test_auth_writes_a_bcrypt_htpasswd_and_a_dockerconfigjson(tmp_path: Path) -> None:
    _, home = _start(tmp_path, registry.Auth("pusher", "pw:1"))
    config = yaml.safe_load((home / "config.yml").read_text())
    htpasswd = Path(config["auth"]["htpasswd"]["path"])
    user, hashed = htpasswd.read_text().strip().split(":", 1)
    assert user == "pusher"
    assert hashed.startswith("$2b$")
    assert bcrypt.checkpw(b"pw:1", hashed.encode())
    assert htpasswd.stat().st_mode & 0o077 == 0
    document = (home / "auth.json").read_text()
    port = config["http"]["addr"].rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", "10.253.0.1:5000"):
        assert auth.credentials_for(document, host) == auth.Credentials("pusher", "pw:1")
    encoded = json.loads(document)["auths"]["10.253.0.1:5000"]["auth"]
    assert base64.b64decode(encoded) == b"pusher:pw:1"


def test_ports_chosen_by_up_are_the_ones_served(tmp_path: Path) -> None:
    seen: list[str] = []

    def launch(name: str, argv: list[str], *, health_url: str) -> processes.Process:
        seen.append(health_url)
        return processes.Process(name, 0, -1, tmp_path / "log", tuple(argv), health_url)

    credentials = pki.create(tmp_path / "pki", ())
    _, record = registry.start(
        launch,
        tmp_path,
        Path("/bin/registry"),
        credentials,
        auth=None,
        port=41000,
        debug_port=41001,
    )
    config = yaml.safe_load((tmp_path / "registry" / "config.yml").read_text())
    assert config["http"]["addr"] == "127.0.0.1:41000"
    assert record.host == "127.0.0.1:41000"
    assert seen == ["http://127.0.0.1:41001/debug/health"]
