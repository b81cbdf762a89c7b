"""Extra certificate authorities for registry requests, as a user gives them:
PEM files, or directories of them (a mounted ConfigMap or Secret, whose keys
are files and whose ``..data`` bookkeeping entries start with a dot).

``load`` expands and checks them once, at start, so a bad file is an error
naming it then, not a TLS failure at the first registry request. The check
is OpenSSL's own, the one registry requests load the file with (``ssl``):
a file counts when TLS takes at least one certificate from it. Not
``cryptography``'s parser: importing it costs the operator ~9 MiB of
resident memory for this one check at start (``bench/bench_operator.py``).

``context`` is the TLS context registry requests are made with: one per
trust configuration (the system's roots plus the CA files, or no
verification), shared by every client and existence check. A context with
the system's roots holds ~1 MiB of parsed certificates and takes ~25 ms to
make; one per check, four checks at once, left the operator's heap 4 MiB
larger for good. A CA file changed on disk (a ConfigMap's update swaps the
file its key links to) makes a new one.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

__all__ = ["context", "load"]

# A file as last seen: path, inode, size, modification time; the path alone
# once it cannot be read (making the context then says why).
_Stamp = tuple[str, ...]
# (verify, CA files) -> (their stamps when made, the context).
_contexts: dict[tuple[bool, tuple[Path, ...]], tuple[tuple[_Stamp, ...], ssl.SSLContext]] = {}


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
        if not found:
            raise ValueError(f"{path} is a directory without certificate files")
        return found
    if not path.is_file():
        raise ValueError(f"{path} is neither a file nor a directory")
    return [path]


def _check(file: Path) -> None:
    """ValueError naming ``file`` unless TLS loads a certificate from it."""
    try:
        file.read_bytes()
    except OSError as err:
        raise ValueError(f"{file}: {err.strerror}") from err
    # No system roots: what counts is what this file adds.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(file))
    except ssl.SSLError as err:  # no PEM block, or one TLS cannot read
        raise ValueError(f"{file} holds no PEM certificate TLS accepts ({err})") from err
    if not context.cert_store_stats()["x509"]:  # revocation lists only
        raise ValueError(f"{file} holds no PEM certificate")


def load(paths: Sequence[Path]) -> tuple[Path, ...]:
    """Every CA file ``paths`` name (directories expanded), each checked to
    hold PEM certificates that TLS accepts; ValueError naming the first that
    does not."""
    files: list[Path] = []
    for path in paths:
        for file in _files(path):
            _check(file)
            files.append(file)
    return tuple(files)


def _stamp(path: Path) -> _Stamp:
    try:
        found = path.stat()
    except OSError:
        return (str(path),)
    return (str(path), str(found.st_ino), str(found.st_size), str(found.st_mtime_ns))


def _make(ca_files: tuple[Path, ...], *, verify: bool) -> ssl.SSLContext:
    if not verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context()
    for path in ca_files:
        context.load_verify_locations(cafile=str(path))
    return context


def context(ca_files: Sequence[Path] = (), *, verify: bool = True) -> ssl.SSLContext:
    """The system's roots plus ``ca_files``; no verification when ``verify``
    is False (a registry's ``insecureSkipTLSVerify``). Shared: callers must
    not change it."""
    files = tuple(ca_files) if verify else ()
    stamps = tuple(_stamp(path) for path in files)
    kept = _contexts.get((verify, files))
    if kept is not None and kept[0] == stamps:
        return kept[1]
    made = _make(files, verify=verify)
    _contexts[(verify, files)] = (stamps, made)
    return made
