"""Finding cluster access the way kubectl does.

``load`` tries, in kubectl's order:

1. ``--kubeconfig FILE`` when given (that file only; it must exist);
2. else ``$KUBECONFIG``, a ``:``-separated list of files merged as kubectl
   merges them: for clusters, users and contexts the first file to define a
   name wins, and so does the first ``current-context``; missing files are
   skipped;
3. else ``~/.kube/config``;
4. when none of those gives a context: the in-cluster service account
   (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the mounted token and CA; in
   ``$KMM_IN_CLUSTER_DIR`` when set, which is how ``kmm kubelet`` tells the
   processes it runs for pods where their mount is).

``--context`` picks a context other than ``current-context``. Relative paths
in a file are relative to that file. A user may authenticate with a token or
token file, a client certificate (file or data), basic auth, or an exec
credential plugin (``kube.credentials`` runs it), and impersonate another
user (``as``, ``as-groups``, ``as-uid``); ``auth-provider`` is refused with
a message. When nothing works, ``ConfigError`` lists each place
tried and why it did not do.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kmm.kube import errors

__all__ = ["IN_CLUSTER_DIR", "Access", "ExecConfig", "load"]

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclasses.dataclass(frozen=True)
class ExecConfig:
    """A user's ``exec`` credential plugin (client.authentication.k8s.io)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    install_hint: str = ""
    provide_cluster_info: bool = False
    interactive_mode: str = "IfAvailable"


@dataclasses.dataclass(frozen=True)
class Access:
    """Where the API server is and how to prove who we are."""

    server: str
    source: str
    namespace: str = "default"
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    username: str | None = None
    password: str | None = None
    exec: ExecConfig | None = None
    proxy_url: str | None = None
    # kubectl's --as / --as-group / --as-uid (kubeconfig: as, as-groups, as-uid).
    impersonate: str | None = None
    impersonate_groups: tuple[str, ...] = ()
    impersonate_uid: str | None = None


@dataclasses.dataclass
class _Merged:
    files: list[Path] = dataclasses.field(default_factory=list)
    clusters: dict[str, tuple[dict[str, Any], Path]] = dataclasses.field(default_factory=dict)
    users: dict[str, tuple[dict[str, Any], Path]] = dataclasses.field(default_factory=dict)
    contexts: dict[str, tuple[dict[str, Any], Path]] = dataclasses.field(default_factory=dict)
    current: str | None = None

    def add(self, path: Path) -> None:
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise errors.ConfigError(f"cannot read kubeconfig {path}: {err}") from err
        if not isinstance(document, Mapping):
            raise errors.ConfigError(f"kubeconfig {path} is not a mapping")
        self.files.append(path)
        for key, field, into in (
            ("clusters", "cluster", self.clusters),
            ("users", "user", self.users),
            ("contexts", "context", self.contexts),
        ):
            for entry in document.get(key) or ():
                if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                    raise errors.ConfigError(f"kubeconfig {path}: an entry of {key} has no name")
                value = entry.get(field) or {}
                if not isinstance(value, Mapping):
                    raise errors.ConfigError(
                        f"kubeconfig {path}: {key} {entry['name']} is not a mapping"
                    )
                into.setdefault(entry["name"], (dict(value), path))
        current = document.get("current-context")
        if self.current is None and isinstance(current, str) and current:
            self.current = current


def _decode(value: Any, what: str, path: Path) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as err:
        raise errors.ConfigError(f"kubeconfig {path}: {what} is not base64: {err}") from err


def _relative(value: Any, path: Path) -> Path:
    found = Path(str(value)).expanduser()
    return found if found.is_absolute() else path.parent / found


def _exec(config: Mapping[str, Any], user: str, path: Path) -> ExecConfig:
    command = config.get("command")
    if not isinstance(command, str) or not command:
        raise errors.ConfigError(f"kubeconfig {path}: user {user}: exec needs a command")
    if "/" in command and not command.startswith("/"):
        command = str(path.parent / command)
    env = tuple(
        (str(item.get("name")), str(item.get("value", "")))
        for item in config.get("env") or ()
        if isinstance(item, Mapping)
    )
    return ExecConfig(
        command=command,
        args=tuple(str(a) for a in config.get("args") or ()),
        env=env,
        api_version=str(config.get("apiVersion") or "client.authentication.k8s.io/v1"),
        install_hint=str(config.get("installHint") or ""),
        provide_cluster_info=bool(config.get("provideClusterInfo")),
        interactive_mode=str(config.get("interactiveMode") or "IfAvailable"),
    )


def _from_context(merged: _Merged, name: str) -> Access:
    context, context_file = merged.contexts[name]
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if cluster_name not in merged.clusters:
        raise errors.ConfigError(
            f"context {name} ({context_file}) names cluster {cluster_name!r}, which no kubeconfig defines"
        )
    cluster, cluster_file = merged.clusters[cluster_name]
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise errors.ConfigError(f"cluster {cluster_name} ({cluster_file}) has no server")
    user: dict[str, Any] = {}
    user_file = context_file
    if user_name:
        if user_name not in merged.users:
            raise errors.ConfigError(
                f"context {name} ({context_file}) names user {user_name!r}, which no kubeconfig defines"
            )
        user, user_file = merged.users[user_name]
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise errors.ConfigError(
            f"user {user_name} ({user_file}) uses auth-provider {provider!r}, which kmm does not "
            "support (client-go deprecated it): use an exec credential plugin instead"
        )
    return Access(
        server=server.rstrip("/"),
        source=f"context {name} of {context_file}",
        namespace=str(context.get("namespace") or "default"),
        ca_file=_relative(cluster["certificate-authority"], cluster_file)
        if cluster.get("certificate-authority")
        else None,
        ca_data=_decode(
            cluster["certificate-authority-data"], "certificate-authority-data", cluster_file
        )
        if cluster.get("certificate-authority-data")
        else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy_url=cluster.get("proxy-url") or None,
        client_cert_file=_relative(user["client-certificate"], user_file)
        if user.get("client-certificate")
        else None,
        client_key_file=_relative(user["client-key"], user_file)
        if user.get("client-key")
        else None,
        client_cert_data=_decode(
            user["client-certificate-data"], "client-certificate-data", user_file
        )
        if user.get("client-certificate-data")
        else None,
        client_key_data=_decode(user["client-key-data"], "client-key-data", user_file)
        if user.get("client-key-data")
        else None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=_relative(user["tokenFile"], user_file) if user.get("tokenFile") else None,
        username=str(user["username"]) if user.get("username") else None,
        password=str(user["password"]) if user.get("password") else None,
        exec=_exec(user["exec"], str(user_name), user_file) if user.get("exec") else None,
        impersonate=str(user["as"]) if user.get("as") else None,
        impersonate_groups=tuple(str(g) for g in user.get("as-groups") or ()),
        impersonate_uid=str(user["as-uid"]) if user.get("as-uid") else None,
    )


def _in_cluster(environ: Mapping[str, str], directory: Path) -> Access:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise errors.ConfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token = directory / "token"
    if not token.is_file():
        raise errors.ConfigError(f"no service account token at {token}")
    namespace = directory / "namespace"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return Access(
        server=f"https://{host}:{port}",
        source="the in-cluster service account",
        namespace=namespace.read_text().strip() if namespace.is_file() else "default",
        ca_file=directory / "ca.crt",
        # Bound tokens rotate: the client re-reads the file (kube.credentials).
        token_file=token,
    )


def load(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    in_cluster_dir: Path = IN_CLUSTER_DIR,
) -> Access:
    """Cluster access as kubectl would find it; ``ConfigError`` lists what was tried."""
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    tried: list[str] = []
    merged = _Merged()
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise errors.ConfigError(f"--kubeconfig {kubeconfig}: no such file")
        merged.add(kubeconfig)
    elif environ.get("KUBECONFIG"):
        listed: Sequence[str] = [p for p in environ["KUBECONFIG"].split(os.pathsep) if p]
        for entry in listed:
            path = Path(entry).expanduser()
            if path.is_file():
                merged.add(path)
        if not merged.files:
            tried.append(f"$KUBECONFIG ({environ['KUBECONFIG']}): no such files")
    else:
        default = home / ".kube" / "config"
        if default.is_file():
            merged.add(default)
        else:
            tried.append(f"{default}: no such file ($KUBECONFIG is not set)")
    if merged.contexts or context is not None:
        name = context or merged.current
        if name is None:
            raise errors.ConfigError(
                f"no current-context in {', '.join(map(str, merged.files))}; "
                f"choose one with --context ({', '.join(sorted(merged.contexts))})"
            )
        if name not in merged.contexts:
            known = ", ".join(sorted(merged.contexts)) or "none"
            where = ", ".join(map(str, merged.files)) or "no kubeconfig"
            raise errors.ConfigError(f"context {name!r} not found in {where} (contexts: {known})")
        return _from_context(merged, name)
    if kubeconfig is not None:
        raise errors.ConfigError(f"--kubeconfig {kubeconfig}: no contexts")
    if merged.files:
        tried.append(f"{', '.join(map(str, merged.files))}: no contexts")
    # A process kmm kubelet runs for a pod cannot see the service account
    # volume at its usual place; it is told where it is.
    if environ.get("KMM_IN_CLUSTER_DIR"):
        in_cluster_dir = Path(environ["KMM_IN_CLUSTER_DIR"])
    try:
        return _in_cluster(environ, in_cluster_dir)
    except errors.ConfigError as err:
        tried.append(f"in-cluster: {err}")
    raise errors.ConfigError("no cluster access; tried " + "; ".join(tried))
