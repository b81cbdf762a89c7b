"""The inputs of build, sign and preflight pods: the ConfigMaps and Secrets
they read, in the Module's namespace.

One list (``wanted``) says which a pod of one kernel reads: the
``imageRepoSecret``; to build, the Dockerfile ConfigMap and the build
secrets; to sign, the key and certificate Secrets. ``read`` GETs them (the
only I/O here; no informer on Secrets) into a ``Snapshot``: each one's
resourceVersion, each ConfigMap's Dockerfile text, and each Secret's
certificate fingerprint (``fingerprint``: what a signed image's label
names; a certificate is public, its digest too). ``of_pod`` picks from
a snapshot what one pod depends on (``hashing`` digests it) or says which
inputs are missing. The build concern and the preflight reconciler read and
pick through here, so they cannot disagree on what a pod needs.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final, Literal, Protocol

from kmm.api import kernels, modules
from kmm.operator.build import podparts

__all__ = ["BOTH", "Picked", "Reader", "Snapshot", "fingerprint", "of_pod", "read", "wanted"]

RawObject = dict[str, Any]
Kind = Literal["ConfigMap", "Secret"]
BOTH: Final[tuple[podparts.PodRole, podparts.PodRole]] = ("build", "sign")
# The key of a sign's certificate in its Secret (KMM's).
CERT_KEY: Final = "cert"
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)


class Reader(Protocol):
    """GETs of the objects pods read; None when absent."""

    async def get(self, kind: Kind, namespace: str, name: str) -> RawObject | None: ...


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What was read of some inputs: ``Kind/name`` -> resourceVersion of
    those that exist, and each ConfigMap's ``dockerfile`` text by name."""

    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dockerfiles: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Secret name -> sha256 (hex) of the DER form of its ``cert`` key.
    certificates: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Picked:
    """What one pod depends on: ``versions`` of its inputs, the Dockerfile
    text when it builds (else ""), or the inputs ``missing`` (each a phrase:
    "Secret ns/key does not exist")."""

    versions: dict[str, str]
    dockerfile: str
    missing: list[str]


def wanted(
    module: modules.Module, target: kernels.Target, roles: Collection[podparts.PodRole] = BOTH
) -> list[str]:
    """``Kind/name`` of every ConfigMap and Secret a pod doing ``roles`` for
    ``target`` reads, each once, in a stable order (a role the target does
    not have adds nothing)."""
    found: list[str] = []
    secret = module.spec.image_repo_secret
    if secret is not None:
        found.append(f"Secret/{secret.name}")
    if target.build is not None and "build" in roles:
        found.append(f"ConfigMap/{target.build.dockerfile_config_map}")
        found.extend(f"Secret/{name}" for name in target.build.secrets)
    if target.sign is not None and "sign" in roles:
        found.extend((f"Secret/{target.sign.key_secret}", f"Secret/{target.sign.cert_secret}"))
    return list(dict.fromkeys(found))


def of_pod(
    found: Snapshot,
    module: modules.Module,
    target: kernels.Target,
    roles: Collection[podparts.PodRole] = BOTH,
) -> Picked:
    """What a pod doing ``roles`` for ``target`` depends on, from ``found``."""
    namespace = module.metadata.namespace or ""
    names = wanted(module, target, roles)
    versions = {w: found.versions[w] for w in names if w in found.versions}
    missing = [
        f"{w.replace('/', f' {namespace}/', 1)} does not exist" for w in names if w not in versions
    ]
    dockerfile = ""
    if target.build is not None and "build" in roles and not missing:
        config_map = target.build.dockerfile_config_map
        if config_map in found.dockerfiles:
            dockerfile = found.dockerfiles[config_map]
        else:
            missing.append(
                f"ConfigMap {namespace}/{config_map} has no key {podparts.DOCKERFILE_KEY!r}"
            )
    return Picked(versions, dockerfile, missing)


def fingerprint(data: bytes) -> str | None:
    """sha256 (hex) of a certificate's DER form, as the sign pod computes it
    (``openssl x509 -outform DER``: the first certificate of a PEM file);
    None when ``data`` is neither PEM nor DER."""
    found = _PEM.search(data)
    if found is not None:
        try:
            data = base64.b64decode(b"".join(found.group(1).split()), validate=True)
        except binascii.Error:
            return None
    if not data.startswith(b"\x30"):  # a DER SEQUENCE
        return None
    return hashlib.sha256(data).hexdigest()


def _certificate(obj: RawObject) -> str | None:
    encoded = (obj.get("data") or {}).get(CERT_KEY)
    if not isinstance(encoded, str):
        return None
    try:
        return fingerprint(base64.b64decode(encoded, validate=True))
    except binascii.Error:
        return None


async def read(reader: Reader, namespace: str, names: Iterable[str]) -> Snapshot:
    """GET each ``Kind/name`` of ``names`` in ``namespace``: the
    resourceVersions of those that exist and each ConfigMap's Dockerfile."""
    versions: dict[str, str] = {}
    dockerfiles: dict[str, str] = {}
    certificates: dict[str, str] = {}
    for each in names:
        kind, _, name = each.partition("/")
        obj = await reader.get("ConfigMap" if kind == "ConfigMap" else "Secret", namespace, name)
        if obj is None:
            continue
        versions[each] = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        text = (obj.get("data") or {}).get(podparts.DOCKERFILE_KEY)
        if kind == "ConfigMap" and isinstance(text, str):
            dockerfiles[name] = text
        if kind == "Secret" and (found := _certificate(obj)) is not None:
            certificates[name] = found
    return Snapshot(versions=versions, dockerfiles=dockerfiles, certificates=certificates)
