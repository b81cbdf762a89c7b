"""Cluster access as kubectl finds it, through ``kmm modules`` run as a user runs it.

Each case starts the real command in a process of its own, with a HOME and
environment of the case's making: only ``$KUBECONFIG``; only
``~/.kube/config``; a two-file ``$KUBECONFIG`` with ``--context``; an exec
credential plugin; nothing at all (the error names every place tried).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import test_operator_support as support
import yaml
from kubernetes_asyncio import client

from kmm.sandbox import testing

manifests = support.manifests

KMM = pathlib.Path(sys.executable).with_name("kmm")


def run(home: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k != "KUBECONFIG" and not k.startswith("KUBERNETES_SERVICE")
    }
    return subprocess.run(
        [str(KMM), "modules", *args],
        env={**clean, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_listed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert "NAMESPACE" in result.stdout


def sandbox_config(sandbox: testing.RunningSandbox) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(sandbox.kubeconfig.read_text())
    return found


def write(path: pathlib.Path, document: dict[str, Any]) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def test_only_kubeconfig_env(
    sandbox: testing.RunningSandbox, manifests: None, tmp_path: pathlib.Path
) -> None:
    assert_listed(run(tmp_path, KUBECONFIG=str(sandbox.kubeconfig)))


def test_only_home_kube_config(
    sandbox: testing.RunningSandbox, manifests: None, tmp_path: pathlib.Path
) -> None:
    write(tmp_path / ".kube" / "config", sandbox_config(sandbox))
    assert_listed(run(tmp_path))


def test_two_files_and_a_context(
    sandbox: testing.RunningSandbox, manifests: None, tmp_path: pathlib.Path
) -> None:
    broken = write(
        tmp_path / "first.yaml",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gone", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "gone", "user": {"token": "x"}}],
            "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}],
            "current-context": "gone",
        },
    )
    theirs = sandbox_config(sandbox)
    theirs["contexts"][0]["name"] = "sandbox"
    theirs["current-context"] = "sandbox"
    second = write(tmp_path / "second.yaml", theirs)
    merged = f"{broken}:{second}"
    # The first file's current-context wins and names a cluster nobody serves.
    failing = run(tmp_path, KUBECONFIG=merged)
    assert failing.returncode != 0
    assert "127.0.0.1:1" in failing.stderr
    assert_listed(run(tmp_path, "--context", "sandbox", KUBECONFIG=merged))


async def _admin_token(api: client.ApiClient, name: str) -> str:
    core = client.CoreV1Api(api)
    await core.create_namespaced_service_account(
        "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    await client.RbacAuthorizationV1Api(api).create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
        }
    )
    issued = await core.create_namespaced_service_account_token(
        name, "default", {"spec": {"expirationSeconds": 3600}}
    )
    token: str = issued.status.token
    return token


async def test_exec_credential_plugin(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    tmp_path: pathlib.Path,
) -> None:
    name = f"exec-{tmp_path.name[-8:].lower().strip('-_')}"
    token = await _admin_token(api_client, name)
    try:
        runs = tmp_path / "runs"
        plugin = tmp_path / "bin" / "token-plugin"
        plugin.parent.mkdir()
        credential = {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": token},
        }
        plugin.write_text(
            f"#!{sys.executable}\n"
            "import json, os\n"
            f"open({str(runs)!r}, 'a').write(os.environ['KUBERNETES_EXEC_INFO'] + '\\n')\n"
            f"print(json.dumps({credential!r}))\n"
        )
        plugin.chmod(0o755)
        config = sandbox_config(sandbox)
        cluster = config["clusters"][0]["cluster"]
        ca = pathlib.Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
        config["users"][0]["user"] = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "./bin/token-plugin",
                "interactiveMode": "Never",
                "provideClusterInfo": True,
            }
        }
        kubeconfig = write(tmp_path / "exec.yaml", config)
        assert_listed(run(tmp_path, "--kubeconfig", str(kubeconfig)))
        [info] = [json.loads(line) for line in runs.read_text().splitlines()]
        assert info["spec"]["cluster"]["server"] == cluster["server"]
        assert info["spec"]["interactive"] is False
    finally:
        await client.RbacAuthorizationV1Api(api_client).delete_cluster_role_binding(name)
        await client.CoreV1Api(api_client).delete_namespaced_service_account(name, "default")


def test_no_access_names_every_place_tried(tmp_path: pathlib.Path) -> None:
    # Wide enough that no path is wrapped inside (xdist's tmp_path is longer).
    result = run(tmp_path, COLUMNS="400")
    assert result.returncode == 2
    # Rich may draw the message in a box, wrapped: read it without the frame.
    error = " ".join(result.stderr.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())
    assert f"{tmp_path}/.kube/config: no such file ($KUBECONFIG is not set)" in error
    assert "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set" in error


@pytest.mark.parametrize("option", ["--kubeconfig", "--context"])
def test_every_cluster_command_takes_the_same_options(option: str) -> None:
    for command in ("operator", "apply", "modules", "driver"):
        shown = subprocess.run(
            [str(KMM), command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        assert option in shown, command
