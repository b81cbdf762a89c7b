"""Certificates and keys for one sandbox: a CA, the API server's serving
certificate, client certificates per identity, and the service-account key.

Everything is written with owner-only permissions into the sandbox directory
and lives as long as it; nothing here is meant for a real cluster.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kmm.sandbox import addressing

__all__ = ["ClientIdentity", "Pki", "create", "issue_serving"]

_VALIDITY = datetime.timedelta(days=365)


@dataclasses.dataclass(frozen=True)
class ClientIdentity:
    """Who a client certificate says it is: user name and groups."""

    file_stem: str
    user: str
    groups: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, identity: ClientIdentity) -> Path:
        return self.directory / f"{identity.file_stem}.crt"

    def client_key(self, identity: ClientIdentity) -> Path:
        return self.directory / f"{identity.file_stem}.key"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    # ECDSA keys only sign: TLS handshakes, and for the CA, certificates and CRLs.
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    alt_names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def create(directory: Path, clients: tuple[ClientIdentity, ...]) -> Pki:
    """Create a fresh CA, serving certificate, client certificates and SA key."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    pki = Pki(directory)
    now = datetime.datetime.now(datetime.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kmm-sandbox-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki.ca_key, _key_pem(ca_key))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _issue(
        subject=_name("kube-apiserver"),
        key=serving_key,
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        alt_names=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(addressing.KUBERNETES_SERVICE_IP),
            # Where nodes and pods meet it: the relay on the fabric's gateway.
            x509.IPAddress(addressing.GATEWAY),
        ],
    )
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_private(pki.serving_key, _key_pem(serving_key))

    for identity in clients:
        client_key = ec.generate_private_key(ec.SECP256R1())
        client = _issue(
            subject=_name(identity.user, identity.groups),
            key=client_key,
            ca_cert=ca_cert,
            ca_key=ca_key,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        pki.client_cert(identity).write_bytes(client.public_bytes(serialization.Encoding.PEM))
        _write_private(pki.client_key(identity), _key_pem(client_key))

    # Service-account tokens are signed with RSA: every component accepts it.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki.service_account_key, _key_pem(sa_key))
    pki.service_account_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue_serving(
    pki: Pki, stem: str, common_name: str, *, dns_names: tuple[str, ...], ips: tuple[str, ...]
) -> tuple[Path, Path]:
    """A serving certificate from the sandbox CA for another server (the
    registry), written as ``<stem>.crt`` and ``<stem>.key``; their paths."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key} is not the sandbox CA's EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = _issue(
        subject=_name(common_name),
        key=key,
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        alt_names=[
            *(x509.DNSName(name) for name in dns_names),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips),
        ],
    )
    cert_path, key_path = pki.directory / f"{stem}.crt", pki.directory / f"{stem}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, _key_pem(key))
    return cert_path, key_path
