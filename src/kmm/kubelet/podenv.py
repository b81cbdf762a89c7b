"""What a container process of an emulated node is given: argv, environment, paths.

The emulator runs some containers as local processes (``processes``). It has
no mount namespace to give them, so the container's view is translated
instead:

- **paths**: each ``hostPath`` volume mount ``mountPath -> path`` becomes
  ``mountPath -> <root>/<path>`` (the node's host paths live under the
  emulator's ``--root``); ``configMap``, ``secret`` and ``emptyDir`` volumes
  are directories of the pod's own (``project_volumes`` writes a ConfigMap's
  or Secret's keys as files, ``items`` and ``optional`` honoured, and is
  called again to refresh them, as the kubelet syncs them); the service
  account volume (below) maps ``/var/run/secrets/kubernetes.io/serviceaccount``.
  Other volume types are not mapped (logged). An argument, an
  environment value or the working directory that is a mount path, lies
  under one, or is ``--flag=<such a path>`` is rewritten to the mapped path
  (the longest mount path wins, as the innermost mount would);
- **environment**: ``value`` (with ``$(VAR)`` references to earlier
  variables expanded, ``$$`` for a literal ``$``, as the kubelet does), the
  downward API (``fieldRef``: ``metadata.name``, ``.namespace``, ``.uid``,
  ``.labels['k']``, ``.annotations['k']``, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.hostIP(s)``, ``status.podIP(s)``),
  ``resourceFieldRef`` of limits and requests, ``configMapKeyRef`` and
  ``secretKeyRef`` (read from the API server, ``optional`` honoured) and
  ``envFrom``; then ``KUBERNETES_SERVICE_HOST``/``_PORT`` of the API server
  the emulator itself reaches, since a cluster IP means nothing here;
- **command**: ``command`` (or the image's entrypoint ``kmm``) and ``args``,
  ``$(VAR)`` expanded; ``kmm`` resolves to the CLI installed beside the
  emulator;
- **service account**: unless ``automountServiceAccountToken`` is false, a
  token from TokenRequest for the pod's ServiceAccount, bound to the pod,
  with the cluster CA (the namespace's ``kube-root-ca.crt`` ConfigMap) and
  the namespace, written where the mapped service-account directory points;
  a kmm process finds that directory through ``KMM_IN_CLUSTER_DIR``, since
  it cannot see the mount at its usual place.

``ConfigError`` (the kubelet's ``CreateContainerConfigError``) names what is
missing: a ConfigMap, Secret or key that is not optional, a field path the
downward API does not have.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final

from kmm.kube import client, errors, resources

__all__ = [
    "KMM_IN_CLUSTER_DIR",
    "SERVICE_ACCOUNT_PATH",
    "ConfigError",
    "Launch",
    "PathMap",
    "build",
    "expand",
    "kmm_argv",
    "mounts",
    "project_volumes",
    "write_service_account",
]

SERVICE_ACCOUNT_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
KMM_IN_CLUSTER_DIR: Final = "KMM_IN_CLUSTER_DIR"
# The kubelet's default for projected service account tokens.
TOKEN_SECONDS: Final = 3607


class ConfigError(Exception):
    """The container cannot be configured; ``str`` is the kubelet's kind of message."""


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names replaced, unknown ones
    left as written, ``$$`` an escaped ``$``."""

    def replace(found: re.Match[str]) -> str:
        if found[0] == "$$":
            return "$"
        return variables.get(found[1], found[0])

    return _REFERENCE.sub(replace, text)


class PathMap:
    """Container paths to host paths, by mount."""

    def __init__(self, mounts: Mapping[str, Path]) -> None:
        # Longest first: the innermost mount decides.
        self._mounts = sorted(
            ((PurePosixPath(k), v) for k, v in mounts.items()),
            key=lambda item: len(item[0].parts),
            reverse=True,
        )

    def path(self, text: str) -> str:
        if not text.startswith("/"):
            return text
        candidate = PurePosixPath(text)
        for mount, target in self._mounts:
            if candidate == mount or mount in candidate.parents:
                return str(target.joinpath(candidate.relative_to(mount)))
        return text

    def value(self, text: str) -> str:
        """A path, or ``--flag=path``, mapped; anything else as it is."""
        if text.startswith("-") and "=" in text:
            flag, _, rest = text.partition("=")
            return f"{flag}={self.path(rest)}"
        return self.path(text)


def kmm_argv() -> list[str]:
    """How to run the installed ``kmm``: the script beside this interpreter, or the module."""
    script = Path(sys.executable).with_name("kmm")
    if script.is_file():
        return [str(script)]
    found = shutil.which("kmm")
    return [found] if found else [sys.executable, "-c", "from kmm.cli import main; main()"]


@dataclasses.dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or ()),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or ()),
    }
    if path in simple:
        return str(simple[path] or "")
    found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if found:
        return str((meta.get(found[1]) or {}).get(found[2], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(items.items()))
    raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")


def _resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        raise ConfigError(f"resourceFieldRef {ref.get('resource')!r}: not set on the container")
    return str(value)


class _Sources:
    """ConfigMaps and Secrets of the pod's namespace, read once per container start."""

    def __init__(self, api: client.Client, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self._read: dict[tuple[str, str], dict[str, str] | None] = {}

    async def data(self, kind: str, name: str) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self._read:
            path = f"/api/v1/namespaces/{self.namespace}/{kind}/{urllib.parse.quote(name)}"
            try:
                found = await self.api.request("GET", path)
            except errors.NotFound:
                self._read[key] = None
            else:
                data = dict(found.get("data") or {})
                if kind == "secrets":
                    data = {k: base64.b64decode(v).decode() for k, v in data.items()}
                self._read[key] = data
        return self._read[key]

    async def key(self, kind: str, ref: Mapping[str, Any]) -> str | None:
        what = "configmap" if kind == "configmaps" else "secret"
        data = await self.data(kind, str(ref.get("name", "")))
        if data is None:
            if ref.get("optional"):
                return None
            raise ConfigError(f'{what} "{ref.get("name")}" not found')
        if ref.get("key") not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f"couldn't find key {ref.get('key')} in {what} {ref.get('name')}")
        return data[str(ref["key"])]


async def _environment(
    api: client.Client, pod: Mapping[str, Any], container: Mapping[str, Any]
) -> dict[str, str]:
    sources = _Sources(api, str(pod["metadata"]["namespace"]))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        kind, ref = (
            ("configmaps", source["configMapRef"])
            if source.get("configMapRef")
            else ("secrets", source.get("secretRef") or {})
        )
        data = await sources.data(kind, str(ref.get("name", "")))
        if data is None:
            if ref.get("optional"):
                continue
            what = "configmap" if kind == "configmaps" else "secret"
            raise ConfigError(f'{what} "{ref.get("name")}" not found')
        prefix = str(source.get("prefix") or "")
        env.update({prefix + k: v for k, v in data.items()})
    for variable in container.get("env") or ():
        name = str(variable["name"])
        source = variable.get("valueFrom")
        if source is None:
            env[name] = expand(str(variable.get("value") or ""), env)
        elif source.get("fieldRef"):
            env[name] = _field(pod, str(source["fieldRef"].get("fieldPath", "")))
        elif source.get("resourceFieldRef"):
            env[name] = _resource_field(container, source["resourceFieldRef"])
        elif source.get("configMapKeyRef") or source.get("secretKeyRef"):
            kind = "configmaps" if source.get("configMapKeyRef") else "secrets"
            value = await sources.key(
                kind, source.get("configMapKeyRef") or source.get("secretKeyRef")
            )
            if value is not None:
                env[name] = value
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return env


async def write_service_account(
    api: client.Client, pod: Mapping[str, Any], directory: Path
) -> float:
    """Token, CA and namespace into ``directory`` (again to refresh the token);
    the token's lifetime in seconds."""
    meta = pod["metadata"]
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    answer = await api.request(
        "POST",
        resources.SERVICE_ACCOUNTS.path(meta["namespace"], account, subresource="token"),
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        },
    )
    try:
        root_ca = await api.request(
            "GET", f"/api/v1/namespaces/{meta['namespace']}/configmaps/kube-root-ca.crt"
        )
    except errors.NotFound as err:
        raise ConfigError(f'configmap "kube-root-ca.crt" not found: {err}') from err
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("ca.crt", str((root_ca.get("data") or {}).get("ca.crt", ""))),
        ("namespace", str(meta["namespace"])),
        ("token", str(answer["status"]["token"])),
    ):
        staging = directory / f".{name}.tmp"
        staging.write_text(text)
        staging.chmod(0o600)
        staging.replace(directory / name)
    return float(answer.get("spec", {}).get("expirationSeconds") or TOKEN_SECONDS)


def _server_env(server: str) -> dict[str, str]:
    parsed = urllib.parse.urlsplit(server)
    host = parsed.hostname or "127.0.0.1"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(parsed.port or 443),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(parsed.port or 443),
    }


_PROJECTED: Final = ("configMap", "secret", "emptyDir")


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_bytes(data)
    staging.replace(path)


async def project_volumes(api: client.Client, pod: Mapping[str, Any], directory: Path) -> None:
    """The pod's configMap, secret and emptyDir volumes as ``directory/<volume>``;
    called again, rewrites what changed. ``ConfigError`` for a missing source
    that is not optional."""
    namespace = str(pod["metadata"]["namespace"])
    sources = _Sources(api, namespace)
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        target = directory / str(volume["name"])
        if "emptyDir" in volume:
            target.mkdir(parents=True, exist_ok=True)
            continue
        kind = "configmaps" if "configMap" in volume else "secrets" if "secret" in volume else None
        if kind is None:
            continue
        ref = volume.get("configMap") or volume.get("secret") or {}
        name = str(ref.get("name") or ref.get("secretName") or "")
        data = await sources.data(kind, name)
        if data is None:
            if ref.get("optional"):
                target.mkdir(parents=True, exist_ok=True)
                continue
            what = "configmap" if kind == "configmaps" else "secret"
            raise ConfigError(f'volume {volume["name"]}: {what} "{name}" not found')
        files = (
            {str(i["path"]): data[str(i["key"])] for i in ref["items"] if str(i["key"]) in data}
            if ref.get("items")
            else data
        )
        for relative, text in files.items():
            _write_if_changed(target / relative, text.encode())
        for stale in [p for p in target.rglob("*") if p.is_file()] if target.is_dir() else []:
            if str(stale.relative_to(target)) not in files:
                stale.unlink()


def mounts(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    root: Path,
    account_dir: Path | None,
    volume_dir: Path | None = None,
) -> PathMap:
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or ()}
    found: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or ():
        volume = volumes.get(mount.get("name")) or {}
        if volume_dir is not None and any(k in volume for k in _PROJECTED):
            target = volume_dir / str(volume["name"])
            if mount.get("subPath"):
                target = target / str(mount["subPath"])
            found[str(mount["mountPath"])] = target
            continue
        host = volume.get("hostPath")
        if host is None:
            continue
        target = root / str(host.get("path", "/")).lstrip("/")
        if mount.get("subPath"):
            target = target / str(mount["subPath"])
        found[str(mount["mountPath"])] = target
    if account_dir is not None:
        found[SERVICE_ACCOUNT_PATH] = account_dir
    return PathMap(found)


async def build(
    api: client.Client,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    root: Path,
    server: str,
    account_dir: Path,
    base_env: Mapping[str, str],
    volume_dir: Path | None = None,
) -> tuple[Launch, float | None]:
    """The container's launch, and the service account token's lifetime (None
    when no token is mounted). ``ConfigError`` when it cannot be configured."""
    automount = (pod.get("spec") or {}).get("automountServiceAccountToken")
    lifetime = None
    if automount is not False:
        try:
            lifetime = await write_service_account(api, pod, account_dir)
        except errors.ApiError as err:
            raise ConfigError(f"service account token: {err.message}") from err
    if volume_dir is not None:
        await project_volumes(api, pod, volume_dir)
    paths = mounts(pod, container, root, account_dir if lifetime is not None else None, volume_dir)
    env = {k: paths.value(v) for k, v in (await _environment(api, pod, container)).items()}
    command: Sequence[str] = container.get("command") or ["kmm"]
    words = [expand(str(w), env) for w in (*command, *(container.get("args") or ()))]
    argv = [*(kmm_argv() if words[0] == "kmm" else [words[0]]), *words[1:]]
    argv = [argv[0], *(paths.value(w) for w in argv[1:])]
    full = {**base_env, **_server_env(server), **env}
    if lifetime is not None:
        full[KMM_IN_CLUSTER_DIR] = str(account_dir)
    cwd = container.get("workingDir")
    return Launch(argv, full, Path(paths.path(str(cwd))) if cwd else None), lifetime
