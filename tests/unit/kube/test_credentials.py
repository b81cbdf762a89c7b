"""Exec credential plugins, token files and basic auth, with real plugin processes.

The plugin is a small Python script written by each test; it records every
run and what it was told (``KUBERNETES_EXEC_INFO``, its environment).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kmm.kube import credentials, errors, kubeconfigs


def plugin(tmp_path: Path, status: dict[str, Any], *, api_version: str = "client.authentication.k8s.io/v1", exit_code: int = 0) -> Path:  # fmt: skip
    script = tmp_path / "plugin.py"
    answer = {"apiVersion": api_version, "kind": "ExecCredential", "status": status}
    script.write_text(
        "import json, os, sys\n"
        f"with open({str(tmp_path / 'runs.jsonl')!r}, 'a') as log:\n"
        "    log.write(json.dumps({'info': json.loads(os.environ['KUBERNETES_EXEC_INFO']),"
        " 'region': os.environ.get('REGION'), 'args': sys.argv[1:]}) + '\\n')\n"
        f"sys.stderr.write('plugin says no')\n"
        f"print(json.dumps({answer!r}))\n"
        f"sys.exit({exit_code})\n"
    )
    return script


def runs(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "runs.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def access(script: Path, **exec_fields: Any) -> kubeconfigs.Access:
    config = kubeconfigs.ExecConfig(
        command=sys.executable, args=(str(script), "--flag"), env=(("REGION", "eu"),), **exec_fields
    )
    return kubeconfigs.Access(
        server="https://cluster.example:443", source="test", exec=config, ca_data=b"CA"
    )


def future(seconds: float) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_token_is_cached_until_it_expires_then_asked_again(tmp_path: Path) -> None:
    script = plugin(tmp_path, {"token": "t1", "expirationTimestamp": future(3600)})
    creds = credentials.Credentials(access(script, provide_cluster_info=True))
    assert await creds.authorization() == "Bearer t1"
    assert await creds.authorization() == "Bearer t1"
    assert creds.exec_runs == 1
    [run] = runs(tmp_path)
    assert run["region"] == "eu"
    assert run["args"] == ["--flag"]
    assert run["info"] == {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "spec": {
            "interactive": False,
            "cluster": {
                "server": "https://cluster.example:443",
                "certificate-authority-data": "Q0E=",
            },
        },
    }
    creds.invalidate()  # what a 401 does
    assert await creds.authorization() == "Bearer t1"
    assert creds.exec_runs == 2


async def test_an_expired_token_is_never_reused(tmp_path: Path) -> None:
    script = plugin(tmp_path, {"token": "t", "expirationTimestamp": future(-60)})
    creds = credentials.Credentials(access(script))
    await creds.authorization()
    await creds.authorization()
    assert creds.exec_runs == 2
    assert "cluster" not in runs(tmp_path)[0]["info"]["spec"]


async def test_concurrent_requests_share_one_run(tmp_path: Path) -> None:
    import asyncio

    script = plugin(tmp_path, {"token": "t"})
    creds = credentials.Credentials(access(script))
    found = await asyncio.gather(*(creds.authorization() for _ in range(5)))
    assert found == ["Bearer t"] * 5
    assert creds.exec_runs == 1


async def test_a_client_certificate_from_the_plugin(tmp_path: Path) -> None:
    script = plugin(tmp_path, {"clientCertificateData": "CERT", "clientKeyData": "KEY"})
    creds = credentials.Credentials(access(script))
    assert await creds.certificate() == credentials.Certificate(b"CERT", b"KEY")
    assert await creds.authorization() is None


@pytest.mark.parametrize(
    ("status", "kwargs", "message"),
    [
        (
            {"token": "t"},
            {"api_version": "client.authentication.k8s.io/v1beta1"},
            "answered apiVersion",
        ),
        ({}, {}, "neither a token nor a client certificate"),
        ({"clientCertificateData": "C"}, {}, "only one of"),
        ({"token": "t"}, {"exit_code": 3}, "exited with 3: plugin says no; see go/install"),
    ],
)
async def test_a_plugin_that_answers_badly_is_a_config_error(
    tmp_path: Path, status: dict[str, Any], kwargs: dict[str, Any], message: str
) -> None:
    script = plugin(tmp_path, status, **kwargs)
    creds = credentials.Credentials(access(script, install_hint="see go/install"))
    with pytest.raises(errors.ConfigError, match=message):
        await creds.authorization()


async def test_a_missing_plugin_shows_its_install_hint(tmp_path: Path) -> None:
    config = kubeconfigs.ExecConfig(
        command=str(tmp_path / "absent"), install_hint="brew install it"
    )
    creds = credentials.Credentials(
        kubeconfigs.Access(server="https://x", source="test", exec=config)
    )
    with pytest.raises(errors.ConfigError, match=r"cannot run.*brew install it"):
        await creds.authorization()


async def test_basic_auth_and_static_tokens(tmp_path: Path) -> None:
    basic = kubeconfigs.Access(server="https://x", source="t", username="ann", password="pw")
    assert await credentials.Credentials(basic).authorization() == "Basic YW5uOnB3"
    token = kubeconfigs.Access(server="https://x", source="t", token="abc")
    assert await credentials.Credentials(token).authorization() == "Bearer abc"
    nothing = kubeconfigs.Access(server="https://x", source="t")
    assert await credentials.Credentials(nothing).authorization() is None
    half = kubeconfigs.Access(server="https://x", source="t", client_cert_data=b"C")
    with pytest.raises(errors.ConfigError, match="needs both cert and key"):
        await credentials.Credentials(half).certificate()
