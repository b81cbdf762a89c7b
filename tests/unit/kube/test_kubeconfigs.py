"""Finding cluster access as kubectl does: files, merging, contexts, in-cluster, errors."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from kmm.kube import errors, kubeconfigs


def write(path: Path, *, clusters: dict[str, Any], users: dict[str, Any], contexts: dict[str, Any], current: str | None = None) -> Path:  # fmt: skip
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }
    if current:
        document["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def one(path: Path, name: str, server: str, **user: Any) -> Path:
    return write(
        path,
        clusters={name: {"server": server}},
        users={name: user or {"token": f"token-{name}"}},
        contexts={name: {"cluster": name, "user": name}},
        current=name,
    )


def load(tmp_path: Path, **kwargs: Any) -> kubeconfigs.Access:
    kwargs.setdefault("environ", {})
    kwargs.setdefault("home", tmp_path / "home")
    kwargs.setdefault("in_cluster_dir", tmp_path / "no-service-account")
    return kubeconfigs.load(**kwargs)


def test_explicit_file_only(tmp_path: Path) -> None:
    path = one(tmp_path / "a.yaml", "a", "https://a:6443")
    other = one(tmp_path / "b.yaml", "b", "https://b:6443")
    found = load(tmp_path, kubeconfig=path, environ={"KUBECONFIG": str(other)})
    assert found.server == "https://a:6443"
    assert found.token == "token-a"
    assert found.source == f"context a of {path}"


def test_explicit_file_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="no such file"):
        load(tmp_path, kubeconfig=tmp_path / "missing.yaml")


def test_kubeconfig_list_merges_first_wins(tmp_path: Path) -> None:
    first = write(
        tmp_path / "first.yaml",
        clusters={"shared": {"server": "https://first:1"}},
        users={"u": {"token": "first"}},
        contexts={"one": {"cluster": "shared", "user": "u", "namespace": "team"}},
        current="one",
    )
    second = write(
        tmp_path / "second.yaml",
        clusters={"shared": {"server": "https://second:2"}, "own": {"server": "https://own:3"}},
        users={"u": {"token": "second"}, "v": {"token": "v"}},
        contexts={"two": {"cluster": "own", "user": "v"}, "one": {"cluster": "own", "user": "v"}},
        current="two",
    )
    environ = {"KUBECONFIG": f"{first}::{tmp_path / 'missing.yaml'}:{second}"}
    current = load(tmp_path, environ=environ)
    # current-context, context "one", cluster "shared" and user "u": the first file's.
    assert (current.server, current.token, current.namespace) == (
        "https://first:1",
        "first",
        "team",
    )
    chosen = load(tmp_path, environ=environ, context="two")
    assert (chosen.server, chosen.token, chosen.namespace) == ("https://own:3", "v", "default")


def test_home_config_when_kubeconfig_is_unset(tmp_path: Path) -> None:
    one(tmp_path / "home" / ".kube" / "config", "home", "https://home:443")
    assert load(tmp_path).server == "https://home:443"


def test_unknown_context_lists_the_known_ones(tmp_path: Path) -> None:
    path = one(tmp_path / "a.yaml", "a", "https://a:6443")
    with pytest.raises(errors.ConfigError, match=r"context 'nope' not found .* \(contexts: a\)"):
        load(tmp_path, kubeconfig=path, context="nope")


def test_paths_are_relative_to_their_file_and_data_is_decoded(tmp_path: Path) -> None:
    ca = base64.b64encode(b"CA PEM").decode()
    path = write(
        tmp_path / "conf" / "kubeconfig",
        clusters={"c": {"server": "https://c", "certificate-authority-data": ca}},
        users={"u": {"client-certificate": "certs/me.crt", "client-key": "/abs/me.key", "tokenFile": "tok"}},
        contexts={"x": {"cluster": "c", "user": "u"}},
        current="x",
    )  # fmt: skip
    found = load(tmp_path, kubeconfig=path)
    assert found.ca_data == b"CA PEM"
    assert found.client_cert_file == tmp_path / "conf" / "certs" / "me.crt"
    assert found.client_key_file == Path("/abs/me.key")
    assert found.token_file == tmp_path / "conf" / "tok"


def test_bad_base64_names_the_field(tmp_path: Path) -> None:
    path = write(
        tmp_path / "k",
        clusters={"c": {"server": "https://c", "certificate-authority-data": "%%%"}},
        users={"u": {}},
        contexts={"x": {"cluster": "c", "user": "u"}},
        current="x",
    )
    with pytest.raises(errors.ConfigError, match="certificate-authority-data is not base64"):
        load(tmp_path, kubeconfig=path)


def test_exec_plugin_is_read(tmp_path: Path) -> None:
    path = one(
        tmp_path / "k",
        "e",
        "https://e",
        exec={
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "./bin/get-token",
            "args": ["--cluster", "e"],
            "env": [{"name": "REGION", "value": "eu"}],
            "installHint": "install get-token",
            "provideClusterInfo": True,
        },
    )
    found = load(tmp_path, kubeconfig=path)
    assert found.exec == kubeconfigs.ExecConfig(
        command=str(tmp_path / "bin" / "get-token"),
        args=("--cluster", "e"),
        env=(("REGION", "eu"),),
        api_version="client.authentication.k8s.io/v1beta1",
        install_hint="install get-token",
        provide_cluster_info=True,
    )


def test_auth_provider_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = one(tmp_path / "k", "o", "https://o", **{"auth-provider": {"name": "oidc"}})
    with pytest.raises(errors.ConfigError, match=r"auth-provider 'oidc'.*exec credential plugin"):
        load(tmp_path, kubeconfig=path)


def test_in_cluster_when_no_kubeconfig(tmp_path: Path) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("t")
    (account / "namespace").write_text("kmm-system\n")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = load(tmp_path, environ=environ, in_cluster_dir=account)
    assert found.server == "https://[fd00::1]:443"
    assert (found.namespace, found.token_file, found.ca_file) == (
        "kmm-system",
        account / "token",
        account / "ca.crt",
    )


def test_nothing_found_lists_every_place_tried(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError) as raised:
        load(tmp_path)
    message = str(raised.value)
    assert f"{tmp_path / 'home' / '.kube' / 'config'}: no such file" in message
    assert "$KUBECONFIG is not set" in message
    assert "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set" in message
    with pytest.raises(errors.ConfigError, match=r"\$KUBECONFIG \(/nope\): no such files"):
        load(tmp_path, environ={"KUBECONFIG": "/nope"})


def test_impersonation_from_the_user(tmp_path: Path) -> None:
    path = one(
        tmp_path / "k",
        "i",
        "https://i",
        token="t",
        **{"as": "jane", "as-groups": ["ops", "dev"], "as-uid": "42"},
    )
    found = load(tmp_path, kubeconfig=path)
    assert (found.impersonate, found.impersonate_groups, found.impersonate_uid) == (
        "jane",
        ("ops", "dev"),
        "42",
    )
