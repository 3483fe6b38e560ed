"""The conversion webhook's TLS material: from a folder (a Secret the chart mounts) or made at start.

``load_or_generate(cert_dir, hosts, out_dir)`` returns :class:`ServingCert`: the files the HTTPS server
loads and the CA bundle (PEM) the API server must trust, which the operator writes into the CRD's
``spec.conversion.webhook.clientConfig.caBundle``.

- From a folder: ``tls.crt`` and ``tls.key`` (the layout of a ``kubernetes.io/tls`` Secret, e.g. made by
  cert-manager), and ``ca.crt`` when the certificate is not self-signed.
- Generated: a private CA (ECDSA P-256) and a serving certificate it signs for ``hosts`` (DNS names or IP
  addresses), valid for ten years, written to ``out_dir``. They live as long as the process: a restarted
  operator makes new ones and writes the new CA into the CRD.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from dynamo_api.errors import DynamoError

__all__ = ["CertError", "ServingCert", "generate", "load", "load_or_generate"]

VALIDITY = datetime.timedelta(days=3650)


class CertError(DynamoError, ValueError):
    """The certificate folder is incomplete or unreadable; the message names the file and the fix."""


@dataclass(frozen=True)
class ServingCert:
    cert_path: Path
    key_path: Path
    ca_pem: bytes  # what the API server trusts (caBundle)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def generate(hosts: list[str], out_dir: Path) -> ServingCert:
    """A new CA and a serving certificate for ``hosts``, written to ``out_dir`` (tls.crt, tls.key)."""
    if not hosts:
        raise CertError("a serving certificate needs at least one host name or address")
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # clock skew
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("dynamo-sglang-operator webhook CA"))
        .issuer_name(_name("dynamo-sglang-operator webhook CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out_dir / "tls.crt", out_dir / "tls.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ServingCert(cert_path, key_path, ca_cert.public_bytes(serialization.Encoding.PEM))


def load(cert_dir: Path) -> ServingCert:
    """The certificate in ``cert_dir``: tls.crt, tls.key and (unless tls.crt is self-signed) ca.crt."""
    cert_path, key_path, ca_path = cert_dir / "tls.crt", cert_dir / "tls.key", cert_dir / "ca.crt"
    for path in (cert_path, key_path):
        if not path.is_file():
            raise CertError(
                f"{path} does not exist: --webhook-cert-dir must hold tls.crt and tls.key (and ca.crt), "
                "e.g. a mounted kubernetes.io/tls Secret; leave it unset to have a certificate generated"
            )
    try:
        ca_pem = (ca_path if ca_path.is_file() else cert_path).read_bytes()
        x509.load_pem_x509_certificates(ca_pem)
    except (OSError, ValueError) as exc:
        raise CertError(f"cannot read the CA certificate in {cert_dir} ({exc}); it must be PEM") from None
    return ServingCert(cert_path, key_path, ca_pem)


def load_or_generate(cert_dir: Path | None, hosts: list[str], out_dir: Path) -> ServingCert:
    return load(cert_dir) if cert_dir is not None else generate(hosts, out_dir)
