"""The sandbox's image registry: the CNCF distribution registry on the host.

It serves TLS on a free port of 127.0.0.1, with a certificate from the
sandbox CA naming every address it is dialled by (127.0.0.1 and localhost
from the host, ``addressing.GATEWAY`` from nodes and pods through the relay).
Image references name it ``REFERENCE_HOST`` (``10.253.0.1:5000``), which
works from every namespace the sandbox makes; host-side clients use the
loopback port the state records. Storage is ``<sandbox>/registry/data``,
deletes are on (tests remove images), and with ``--registry-auth
USER:PASSWORD`` it asks for htpasswd (bcrypt) Basic auth; the credentials are
then also written as a ``.dockerconfigjson`` (``<sandbox>/registry/auth.json``)
naming both hosts, for pushes, pull secrets and ``imageRepoSecret``.

Images can be put into its storage before it starts (``seeds``:
``registryseeding``, linked from a cache, never uploaded).

Health: the registry's debug server (``/debug/health`` on another loopback
port, plain HTTP), which answers without credentials.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import bcrypt
import yaml

from kmm.oci import auth as oci_auth
from kmm.oci import client as oci_client
from kmm.sandbox import addressing, errors, pki, ports, processes, registryseeding, state

__all__ = [
    "COMPONENT",
    "REFERENCE_HOST",
    "Auth",
    "client",
    "parse_auth",
    "running",
    "start",
    "storage",
]

COMPONENT = "registry"
REFERENCE_HOST = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
# bcrypt's cost: distribution checks every request's password against it, so
# the default 12 (~250 ms a check here) would dominate a push.
_BCRYPT_ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class Auth:
    user: str
    password: str = dataclasses.field(repr=False)


def parse_auth(text: str) -> Auth:
    """``USER:PASSWORD`` (the password may hold colons); ValueError naming the flag."""
    user, colon, password = text.partition(":")
    if not colon or not user or not password:
        raise ValueError("--registry-auth must be USER:PASSWORD, both non-empty")
    if any(c.isspace() for c in user):
        raise ValueError("--registry-auth: the user name must not contain white space")
    return Auth(user, password)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(text)


def _config(
    directory: Path, port: int, debug_port: int, cert: Path, key: Path, htpasswd: Path | None
) -> dict[str, object]:
    config: dict[str, object] = {
        "version": "0.1",
        # Access-log lines (one per request) are what tests count requests by.
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(directory / "data")},
            # No blob descriptor cache: seeded images are read from disk.
            "delete": {"enabled": True},
            # No upload purging goroutine touching the tree every 24h.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": f"{ports.HOST}:{port}",
            "tls": {"certificate": str(cert), "key": str(key)},
            "debug": {"addr": f"{ports.HOST}:{debug_port}"},
            # Signs upload state between requests; one process, so any secret.
            "secret": secrets.token_hex(16),
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "kmm-sandbox", "path": str(htpasswd)}}
    return config


def _credentials_document(credentials: Auth, hosts: tuple[str, ...]) -> str:
    encoded = base64.b64encode(f"{credentials.user}:{credentials.password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": encoded} for host in hosts}}, indent=2)


Launch = Callable[..., processes.Process]


def storage(directory: Path) -> Path:
    """The registry storage (the filesystem driver's root) of the sandbox in ``directory``."""
    return directory / "registry" / "data"


def start(
    launch: Launch,
    directory: Path,
    binary: Path,
    credentials: pki.Pki,
    *,
    auth: Auth | None,
    port: int = 0,
    debug_port: int = 0,
    seeds: Sequence[registryseeding.Seed] = (),
) -> tuple[processes.Process, state.RegistryRecord]:
    """Write the registry's files under ``<directory>/registry`` and launch it
    through ``launch`` (the sandbox launcher: name, argv, health_url=...).

    ``port`` and ``debug_port`` (0: free ones now) let ``up`` choose them with
    its other ports, before the relay that forwards
    ``REFERENCE_HOST`` in the fabric to ``127.0.0.1:port`` starts;
    ``seeds`` are in its storage when it starts."""
    home = directory / "registry"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    registryseeding.seed(storage(directory), seeds)
    if not port or not debug_port:
        port, debug_port = ports.free_ports(2)
    cert, key = pki.issue_serving(
        credentials,
        "registry",
        "kmm-sandbox-registry",
        dns_names=("localhost",),
        ips=(ports.HOST, str(addressing.GATEWAY)),
    )
    htpasswd = None
    auth_file = None
    if auth is not None:
        hashed = bcrypt.hashpw(auth.password.encode(), bcrypt.gensalt(_BCRYPT_ROUNDS)).decode()
        htpasswd = home / "htpasswd"
        _write_private(htpasswd, f"{auth.user}:{hashed}\n")
        auth_file = home / "auth.json"
        _write_private(
            auth_file, _credentials_document(auth, (f"{ports.HOST}:{port}", REFERENCE_HOST))
        )
    config = home / "config.yml"
    config.write_text(
        yaml.safe_dump(_config(home, port, debug_port, cert, key, htpasswd), sort_keys=False)
    )
    process = launch(
        COMPONENT,
        [str(binary), "serve", str(config)],
        health_url=f"http://{ports.HOST}:{debug_port}/debug/health",
    )
    return process, state.RegistryRecord(
        host_port=port, reference_host=REFERENCE_HOST, credentials=auth_file
    )


def running(record: state.SandboxState) -> state.RegistryRecord:
    """The sandbox's registry record if its process runs; NotRunning naming why not."""
    if record.registry is None:
        raise errors.NotRunning(
            f"the sandbox in {record.directory} runs no registry; start it with "
            f"`kmm sandbox up --registry --dir {record.directory}`"
        )
    process = next((p for p in record.launched if p.name == COMPONENT), None)
    if process is None or not process.alive():
        raise errors.NotRunning(
            f"the registry of the sandbox in {record.directory} is not running; "
            f"`kmm sandbox start registry --dir {record.directory}` starts it again"
        )
    return record.registry


def client(record: state.SandboxState) -> oci_client.Client:
    """A client of the sandbox's registry from the host (loopback port, the
    sandbox CA, the sandbox's credentials if it asks for any)."""
    registry = running(record)
    found = None
    if registry.credentials is not None:
        found = oci_auth.credentials_for(registry.credentials.read_text(), registry.host)
    return oci_client.Client(
        registry.host,
        credentials=found,
        ca_files=(pki.Pki(record.directory / "pki").ca_cert,),
    )
