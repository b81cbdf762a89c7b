"""The firmware VM nodes boot, and the key their kernels trust for modules.

OVMF from Debian's ``ovmf`` package: with Secure Boot, the SMM-protected
build (``OVMF_CODE_4M.secboot.fd``) and variables holding Microsoft's keys
(``OVMF_VARS_4M.ms.fd``: its UEFI CA signed Debian's shim); without, the
plain build and variables with no key (setup mode: nothing is verified).

How a sandbox's module signing key gets trusted: a sandbox makes one key
and self-signed certificate (``signing_key``: RSA 2048, CA:TRUE as
``openssl req -x509`` makes it), written as ``<dir>/secure-boot/signing.key``
and ``signing.crt`` (PEM; users make the Secrets a Module's ``sign`` names
from them). Each node's copy of the variables gets the certificate in
``MokList`` (shim's GUID) before the node first starts (``variables``, with
``virt-fw-vars``). At boot shim mirrors ``MokList`` into ``MokListRT`` and
the kernel loads it into its machine keyring, which it trusts for module
signatures: a module signed with the sandbox key loads under Secure Boot, an
unsigned one is refused. Nothing is enrolled by hand (no MokManager).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from kmm.sandbox import errors

__all__ = ["SHIM_LOCK_GUID", "SigningKey", "code", "signing_key", "variables"]

OVMF_DIR: Final = Path("/usr/share/OVMF")
# shim's vendor GUID: the owner of MokList entries.
SHIM_LOCK_GUID: Final = "605dab50-e046-4300-abb6-3dd810dd8b23"
_VALIDITY: Final = datetime.timedelta(days=3650)


def _ovmf(name: str) -> Path:
    path = OVMF_DIR / name
    if not path.is_file():
        raise errors.SandboxError(
            f"VM nodes need {path} (Debian's ovmf package: `make vm-tools` installs it)"
        )
    return path


def code(*, secure_boot: bool) -> Path:
    """The firmware's code, read-only and shared by every node."""
    return _ovmf("OVMF_CODE_4M.secboot.fd" if secure_boot else "OVMF_CODE_4M.fd")


def _template(*, secure_boot: bool) -> Path:
    return _ovmf("OVMF_VARS_4M.ms.fd" if secure_boot else "OVMF_VARS_4M.fd")


@dataclasses.dataclass(frozen=True)
class SigningKey:
    """A sandbox's module signing key and certificate (PEM files)."""

    directory: Path

    @property
    def key(self) -> Path:
        return self.directory / "signing.key"

    @property
    def certificate(self) -> Path:
        return self.directory / "signing.crt"

    def certificate_der(self) -> bytes:
        loaded = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        return loaded.public_bytes(serialization.Encoding.DER)

    def subject(self) -> str:
        """The certificate's common name: what ``modinfo -F signer`` shows of
        a module it signed."""
        loaded = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        names = loaded.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value)


def signing_key(sandbox_dir: Path, *, common_name: str) -> SigningKey:
    """The sandbox's signing key in ``<sandbox_dir>/secure-boot``, made now
    unless there (a sandbox keeps one key for its life)."""
    found = SigningKey(sandbox_dir / "secure-boot")
    if found.key.is_file() and found.certificate.is_file():
        return found
    found.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    public = private.public_key()
    # As `openssl req -x509` makes one (its v3_ca section): a CA certificate.
    # 6.12's machine keyring may be built to take CA certificates only.
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(private, hashes.SHA256())
    )
    descriptor = os.open(found.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as stream:
        stream.write(
            private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    found.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return found


def variables(target: Path, key: SigningKey | None, *, secure_boot: bool) -> None:
    """A node's own copy of the firmware's variables at ``target``, with
    ``key``'s certificate in ``MokList`` (see the module docstring)."""
    template = _template(secure_boot=secure_boot)
    if key is None:
        target.write_bytes(template.read_bytes())
        return
    der = target.with_name(target.name + ".mok.der")
    der.write_bytes(key.certificate_der())
    try:
        result = subprocess.run(
            [
                sys.executable, "-m", "virt.firmware.vars",
                "-i", str(template), "-o", str(target),
                "--add-mok", SHIM_LOCK_GUID, str(der),
            ],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    finally:
        der.unlink(missing_ok=True)
    if result.returncode != 0:
        raise errors.SandboxError(
            f"virt-fw-vars could not enroll {key.certificate} in {target}: "
            f"{result.stderr.strip()[-1000:]}"
        )
