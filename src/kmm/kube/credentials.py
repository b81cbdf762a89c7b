"""Proof of identity for each request: tokens, token files, basic auth, exec plugins.

``Credentials(access)`` answers ``authorization()`` (the header value, if
any) and ``certificate()`` (client certificate and key, PEM, if any):

- a static token or basic auth: as written in the kubeconfig;
- a token file, or certificate files: re-read at most once a minute,
  because bound service-account tokens and certificates rotate under a
  running process (client-go does the same);
- an exec plugin (what EKS, GKE and AKS kubeconfigs use): run without stdin,
  with ``KUBERNETES_EXEC_INFO`` set, its ``ExecCredential`` answer cached
  until ``expirationTimestamp``; ``invalidate()`` after a 401 makes the next
  request run it again. Concurrent requests share one run.

A plugin that cannot run or answers nonsense raises ``ConfigError`` naming
the command and, when the kubeconfig has one, its install hint.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

from kmm.kube import errors, kubeconfigs

__all__ = ["Certificate", "Credentials"]

# Files (token, client certificate) are re-read at most this often: rotated
# credentials are picked up without reading a file per request.
_FILE_TTL = 60.0
_EXEC_TIMEOUT = 60.0
# Refresh this long before the plugin's expiry, so no request carries a token
# that lapses on the way.
_EXPIRY_MARGIN = 10.0


@dataclasses.dataclass(frozen=True)
class Certificate:
    cert: bytes
    key: bytes


@dataclasses.dataclass(frozen=True)
class _Issued:
    token: str | None
    certificate: Certificate | None
    expires: float | None  # epoch seconds


class Credentials:
    """The current credentials for one ``Access``."""

    def __init__(self, access: kubeconfigs.Access) -> None:
        self.access = access
        self._token_file: tuple[float, str] | None = None
        self._files: tuple[float, Certificate | None] | None = None
        self._issued: _Issued | None = None
        self._running: asyncio.Future[_Issued] | None = None
        self.exec_runs = 0

    @property
    def refreshable(self) -> bool:
        """Whether a 401 may be cured by asking again (exec plugin, token file)."""
        return self.access.exec is not None or self.access.token_file is not None

    def invalidate(self) -> None:
        self._issued = None
        self._token_file = None
        self._files = None

    async def authorization(self) -> str | None:
        access = self.access
        if access.exec is not None:
            issued = await self._exec()
            if issued.token:
                return f"Bearer {issued.token}"
        if access.token:
            return f"Bearer {access.token}"
        if access.token_file is not None:
            return f"Bearer {self._read_token_file(access.token_file)}"
        if access.username is not None:
            pair = f"{access.username}:{access.password or ''}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None

    async def certificate(self) -> Certificate | None:
        access = self.access
        if access.exec is not None:
            issued = await self._exec()
            if issued.certificate is not None:
                return issued.certificate
        now = time.monotonic()
        if self._files is None or now - self._files[0] > _FILE_TTL:
            self._files = (now, self._read_certificate())
        return self._files[1]

    def _read_certificate(self) -> Certificate | None:
        access = self.access
        try:
            cert = access.client_cert_data or (
                access.client_cert_file.read_bytes() if access.client_cert_file else None
            )
            key = access.client_key_data or (
                access.client_key_file.read_bytes() if access.client_key_file else None
            )
        except OSError as err:
            raise errors.ConfigError(
                f"{access.source}: cannot read the client certificate: {err}"
            ) from err
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise errors.ConfigError(
                f"{access.source}: a client certificate needs both cert and key"
            )
        return Certificate(cert, key)

    def _read_token_file(self, path: os.PathLike[str]) -> str:
        now = time.monotonic()
        if self._token_file is None or now - self._token_file[0] > _FILE_TTL:
            try:
                token = Path(path).read_text().strip()
            except OSError as err:
                raise errors.ConfigError(f"cannot read token file {path}: {err}") from err
            self._token_file = (now, token)
        return self._token_file[1]

    async def _exec(self) -> _Issued:
        issued = self._issued
        if issued is not None and (
            issued.expires is None or issued.expires - _EXPIRY_MARGIN > time.time()
        ):
            return issued
        if self._running is None:
            self._running = asyncio.ensure_future(self._run_plugin())
        running = self._running
        try:
            self._issued = await asyncio.shield(running)
        finally:
            if running.done():
                self._running = None
        return self._issued

    def _exec_info(self) -> str:
        config = self.access.exec
        assert config is not None
        spec: dict[str, Any] = {"interactive": False}
        if config.provide_cluster_info:
            access = self.access
            ca = access.ca_data or (access.ca_file.read_bytes() if access.ca_file else None)
            cluster: dict[str, Any] = {"server": access.server}
            if ca:
                cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
            if access.insecure:
                cluster["insecure-skip-tls-verify"] = True
            if access.tls_server_name:
                cluster["tls-server-name"] = access.tls_server_name
            if access.proxy_url:
                cluster["proxy-url"] = access.proxy_url
            spec["cluster"] = cluster
        return json.dumps(
            {"apiVersion": config.api_version, "kind": "ExecCredential", "spec": spec}
        )

    async def _run_plugin(self) -> _Issued:
        config = self.access.exec
        assert config is not None
        what = f"exec credential plugin {config.command!r} ({self.access.source})"
        hint = f"; {config.install_hint.strip()}" if config.install_hint.strip() else ""
        if config.interactive_mode == "Always":
            raise errors.ConfigError(
                f"{what} needs a terminal (interactiveMode Always); kmm runs it without one"
            )
        env = {**os.environ, **dict(config.env), "KUBERNETES_EXEC_INFO": self._exec_info()}
        self.exec_runs += 1
        try:
            process = await asyncio.create_subprocess_exec(
                config.command,
                *config.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as err:
            raise errors.ConfigError(f"{what} cannot run: {err}{hint}") from err
        try:
            out, err_out = await asyncio.wait_for(process.communicate(), _EXEC_TIMEOUT)
        except TimeoutError as err:
            process.kill()
            await process.wait()
            raise errors.ConfigError(f"{what} did not answer within {_EXEC_TIMEOUT:.0f} s") from err
        if process.returncode != 0:
            detail = err_out.decode("utf-8", "replace").strip()[:500]
            raise errors.ConfigError(f"{what} exited with {process.returncode}: {detail}{hint}")
        return _parse(out, config.api_version, what)


def _parse(output: bytes, api_version: str, what: str) -> _Issued:
    try:
        credential = json.loads(output)
    except ValueError as err:
        raise errors.ConfigError(f"{what} did not print JSON: {err}") from err
    if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
        raise errors.ConfigError(f"{what} did not print an ExecCredential")
    if credential.get("apiVersion") != api_version:
        raise errors.ConfigError(
            f"{what} answered apiVersion {credential.get('apiVersion')!r}, not {api_version!r}"
        )
    status = credential.get("status") or {}
    token = status.get("token") or None
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if bool(cert) != bool(key):
        raise errors.ConfigError(f"{what} gave only one of clientCertificateData and clientKeyData")
    if not token and not cert:
        raise errors.ConfigError(f"{what} gave neither a token nor a client certificate")
    expires: float | None = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expires = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError as err:
            raise errors.ConfigError(f"{what}: bad expirationTimestamp {stamp!r}") from err
    return _Issued(
        token=str(token) if token else None,
        certificate=Certificate(str(cert).encode(), str(key).encode()) if cert else None,
        expires=expires,
    )
