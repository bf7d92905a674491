"""A deployment's own certificate authority and the one certificate every Cleave service
serves and calls with (mTLS), ECDSA P-256.

One leaf for all services: each presents it as a server and as a client (extendedKeyUsage
serverAuth and clientAuth), and every client checks the name `cleave` in it
(`--grpc-tls-server-name=cleave`), so the certificate holds whatever address a service is
dialled at (a pod IP found by DNS, a compose service name). What mTLS buys here is that only
holders of the deployment's secret can talk to its services at all; the token (auth.py) is
the second lock.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# What clients check in the certificate (--grpc-tls-server-name), and what it also names.
SERVER_NAME = "cleave"
ALSO_NAMES = ("localhost", "tokenizer", "kvstore", "prefill", "decode", "pd", "encoder", "gateway")


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def make_ca(common_name: str, days: int) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(common_name), _name(common_name), key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_leaf(ca: Pem, days: int) -> Pem:
    """The services' certificate, signed by `ca`, for server and client use."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key this tool wrote")
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(name) for name in (SERVER_NAME, *ALSO_NAMES)]
    cert = (
        _builder(_name(SERVER_NAME), ca_cert.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def certificates(bundle: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order."""
    return x509.load_pem_x509_certificates(bundle)
