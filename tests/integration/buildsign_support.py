"""Helpers for tests that run build, sign and preflight pods on a container node.

Signing material made with openssl as a user makes it, Secrets, waiting for a
pod to end, reading an image's files back from the sandbox's registry, the
registry's access log as (method, path, status), and checking a module's
appended signature with modinfo and ``openssl cms``. Used by
test_build_pods_in_containers and test_preflight_pods_in_containers.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import re
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.oci import client as oci_client
from kmm.sandbox import cluster, registry

SECRETS = resources.Resource("", "v1", "secrets")
CONFIGMAPS = resources.Resource("", "v1", "configmaps")
# What sign-file appends last to a module.
TRAILER = b"~Module signature appended~\n"
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def signing_material(directory: Path) -> tuple[bytes, bytes, bytes, bytes]:
    """(key in DER, certificate in DER, certificate in PEM, another key in
    PEM), as a user makes them."""
    openssl(
        "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=kmm build-and-sign test/O=kmm", "-outform", "PEM",
        "-keyout", "key.pem", "-out", "cert.pem", cwd=directory,
    )  # fmt: skip
    # DER forms: the sign pod converts the key (sign-file wants PEM) and
    # hands the DER certificate to sign-file as it is.
    openssl("pkey", "-in", "key.pem", "-outform", "DER", "-out", "key.der", cwd=directory)
    openssl("x509", "-in", "cert.pem", "-outform", "DER", "-out", "cert.der", cwd=directory)
    openssl("genpkey", "-algorithm", "RSA", "-out", "other.pem", cwd=directory)
    return (
        (directory / "key.der").read_bytes(),
        (directory / "cert.der").read_bytes(),
        (directory / "cert.pem").read_bytes(),
        (directory / "other.pem").read_bytes(),
    )


def secret(
    name: str, namespace: str, data: dict[str, bytes], kind: str = "Opaque"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": kind,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def config_map(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


async def finished(
    api: kube_client.Client, namespace: str, name: str, expected: str = "Succeeded"
) -> dict[str, Any]:
    """The pod once it ended; its log in the assertion if it did not end as expected."""
    path = resources.PODS.path(namespace=namespace, name=name)
    async with asyncio.timeout(900):
        while True:
            pod = await api.request("GET", path)
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                break
            await asyncio.sleep(1)
    if phase != expected:
        log = await api.request("GET", path + "/log")
        raise AssertionError(f"pod {name} {phase}:\n{log}")
    return pod


async def image_files(client: oci_client.Client, image: str) -> tuple[str, dict[str, bytes]]:
    """(manifest digest, every regular file of the image by path), layers applied in order."""
    name, _, tag = image.partition("/")[2].rpartition(":")
    descriptor, body = await client.get_manifest(name, tag)
    files: dict[str, bytes] = {}
    for layer in json.loads(body)["layers"]:
        blob = await client.get_blob(name, layer["digest"])
        if blob[:2] == b"\x1f\x8b":
            blob = gzip.decompress(blob)
        with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
            for member in archive.getmembers():
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    files["/" + member.name.removeprefix("./")] = extracted.read()
    return descriptor.digest, files


async def pulled(record: cluster.state.SandboxState, image: str) -> tuple[str, dict[str, bytes]]:
    async with registry.client(record) as client:
        return await image_files(client, image)


async def exists(record: cluster.state.SandboxState, image: str) -> bool:
    """Whether the sandbox's registry has a manifest for ``image`` (host/name:tag)."""
    name, _, tag = image.partition("/")[2].rpartition(":")
    async with registry.client(record) as client:
        return await client.exists(name, tag) is not None


def requests(record: cluster.state.SandboxState) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request in the registry's access log, in order."""
    log = record.directory / "logs" / f"{registry.COMPONENT}.log"
    return [
        (m.group(1), m.group(2), int(m.group(3)))
        for m in re.finditer(
            r'"(GET|HEAD|POST|PUT|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d+)', log.read_text()
        )
    ]


def writes(found: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The requests among ``found`` that change what a registry holds."""
    return [r for r in found if r[0] in _WRITES and r[1].startswith("/v2/")]


def modinfo(path: Path) -> dict[str, str]:
    command = shutil.which("modinfo") or "/usr/sbin/modinfo"
    done = subprocess.run([command, str(path)], capture_output=True, text=True, check=True)
    found: dict[str, str] = {}
    key = ""
    for line in done.stdout.splitlines():
        if line[:1].isspace() and key:  # a continued field (the signature's hex)
            found[key] += line.strip()
            continue
        key, _, value = line.partition(":")
        found[key] = found.get(key, "") + value.strip()
    return found


def split_signature(signed: bytes) -> tuple[bytes, bytes]:
    """(the module as it was before signing, the PKCS#7 signature).

    sign-file appends: the module, the signature, a 12-byte struct
    module_signature whose last 4 bytes are the signature's length
    (big-endian), and ``TRAILER``.
    """
    assert signed.endswith(TRAILER)
    info = signed[-len(TRAILER) - 12 : -len(TRAILER)]
    (length,) = struct.unpack(">I", info[8:])
    end = len(signed) - len(TRAILER) - 12
    return signed[: end - length], signed[end - length : end]


def cms_verifies(directory: Path, signature: bytes, content: bytes, cert_pem: bytes) -> bool:
    """Whether ``openssl cms`` accepts ``signature`` over ``content`` by ``cert_pem``'s key."""
    (directory / "sig.der").write_bytes(signature)
    (directory / "content").write_bytes(content)
    (directory / "cert.pem").write_bytes(cert_pem)
    verified = subprocess.run(
        [
            "openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in", "sig.der",
            "-content", "content", "-certfile", "cert.pem", "-nointern", "-noverify",
            "-out", "/dev/null",
        ],
        cwd=directory, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return verified.returncode == 0
