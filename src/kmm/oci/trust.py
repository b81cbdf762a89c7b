"""Extra certificate authorities for registry requests, as a user gives them:
PEM files, or directories of them (a mounted ConfigMap or Secret, whose keys
are files and whose ``..data`` bookkeeping entries start with a dot).

``load`` expands and checks them once, at start, so a bad file is an error
naming it then, not a TLS failure at the first registry request;
``ssl_context`` makes the context registry requests use: the system's roots
plus those files (a registry's own CA is added to, not substituted for, the
public ones, as Docker and containerd do).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509

__all__ = ["load", "ssl_context"]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
        if not found:
            raise ValueError(f"{path} is a directory without certificate files")
        return found
    if not path.is_file():
        raise ValueError(f"{path} is neither a file nor a directory")
    return [path]


def load(paths: Sequence[Path]) -> tuple[Path, ...]:
    """Every CA file ``paths`` name (directories expanded), each checked to
    hold PEM certificates that TLS accepts; ValueError naming the first that
    does not."""
    files: list[Path] = []
    for path in paths:
        for file in _files(path):
            try:
                data = file.read_bytes()
            except OSError as err:
                raise ValueError(f"{file}: {err.strerror}") from err
            try:
                certificates = x509.load_pem_x509_certificates(data)
            except ValueError as err:
                raise ValueError(f"{file} holds no PEM certificate ({err})") from err
            if not certificates:
                raise ValueError(f"{file} holds no PEM certificate")
            try:
                ssl.create_default_context().load_verify_locations(cafile=str(file))
            except ssl.SSLError as err:
                raise ValueError(f"{file} is not a usable CA bundle: {err}") from err
            files.append(file)
    return tuple(files)


def ssl_context(ca_files: Sequence[Path] = (), *, verify: bool = True) -> ssl.SSLContext:
    """The system's roots plus ``ca_files``; no verification when ``verify`` is
    False (a registry's ``insecureSkipTLSVerify``)."""
    if not verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context()
    for path in ca_files:
        context.load_verify_locations(cafile=str(path))
    return context
