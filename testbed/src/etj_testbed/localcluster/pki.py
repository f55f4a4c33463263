"""Certificates for the local control plane, generated on this machine and valid only for loopback."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of the service CIDR is the in-cluster `kubernetes` Service; pods verify it.
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class LocalPKI:
    """A CA plus the serving and client certificates each component needs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = Pair(self.dir / "ca.crt", self.dir / "ca.key")
        self.sa_key = self.dir / "sa.key"
        self.sa_pub = self.dir / "sa.pub"

    def ensure(self) -> None:
        if not self.ca.cert.exists():
            self._make_ca()
        if not self.sa_key.exists():
            key = _key()
            _write(self.sa_key, _key_bytes(key), private=True)
            _write(
                self.sa_pub,
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                ),
            )

    def _make_ca(self) -> None:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("etj-local-ca"))
            .issuer_name(_name("etj-local-ca"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write(self.ca.key, _key_bytes(key), private=True)
        _write(self.ca.cert, cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, cn: str, org: str | None = None, server: bool = False) -> Pair:
        pair = Pair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists():
            return pair
        ca_key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usage = (
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            if server
            else [ExtendedKeyUsageOID.CLIENT_AUTH]
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes"),
                        x509.DNSName("kubernetes.default"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.DNSName("kubernetes.default.svc.cluster.local"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address(KUBERNETES_SERVICE_IP)),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        _write(pair.key, _key_bytes(key), private=True)
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
        return pair
