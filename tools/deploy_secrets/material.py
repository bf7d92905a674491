"""A deployment's secrets in one folder, written once and kept (every run adds only what is
missing), with the staged rotations docs/deploy.md describes.

    grpc-token      the gRPC token, one per line: services send the first, accept any
    ca.crt          the CA bundle services trust (two CAs while one is rotated)
    tls.crt/.key    the certificate every service serves and calls with (pki.py)
    ca.key          the CA's key, to issue the next certificate (kept with the operator, never
                    given to a service; --no-ca-key drops it)
    redis-password  Redis passwords, one per line: the kvstore uses the first
    redis.conf      Redis's ACL line accepting every one of them (redis-server reads it)
    kv-auth-key     the kvstore's HMAC key for stored chunks (--kv-auth-key-file)

Every file is written 0600 (the folder 0700) by a rename, so a reader never sees half a file.
"""

from __future__ import annotations

import enum
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tools.deploy_secrets import pki

TOKEN = "grpc-token"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
NEXT_CA_KEY = "ca.next.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
REDIS_PASSWORD = "redis-password"
REDIS_CONF = "redis.conf"
KV_AUTH_KEY = "kv-auth-key"

# What the services mount (the CA's keys never are).
GRPC_FILES = (TOKEN, CA_CERT, TLS_CERT, TLS_KEY)
REDIS_FILES = (REDIS_PASSWORD, REDIS_CONF)
KV_AUTH_FILES = (KV_AUTH_KEY,)


class Step(enum.Enum):
    """A rotation in three rollouts, each of which every service gets before the next."""

    BEGIN = "begin"  # the new secret is accepted everywhere; the old one still used
    SWITCH = "switch"  # the new one is used everywhere; the old one still accepted
    FINISH = "finish"  # the old one is gone


class RotationError(Exception):
    """A step that does not follow from the folder's state (e.g. switch before begin)."""


@dataclass(frozen=True)
class Options:
    days: int = 365  # validity of the CA and the certificate
    keep_ca_key: bool = True
    name: str = "cleave"  # the CA's common name: "<name> deployment CA"


class Secrets:
    def __init__(self, folder: Path, options: Options | None = None) -> None:
        self.folder = folder
        self.options = options or Options()

    # -- files ----------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.folder / name

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def lines(self, name: str) -> list[str]:
        return [line.strip() for line in self.read(name).decode().splitlines() if line.strip()]

    def write(self, name: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        temporary = self.path(f".{name}.part")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(payload)
        os.replace(temporary, self.path(name))

    def has(self, name: str) -> bool:
        return self.path(name).is_file()

    # -- creation -------------------------------------------------------------------------
    def ensure(self) -> list[str]:
        """Writes whatever is missing; returns what it wrote."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        written: list[str] = []
        if not self.has(TOKEN):
            self.write(TOKEN, new_token() + "\n")
            written.append(TOKEN)
        if not (self.has(CA_CERT) and self.has(TLS_CERT) and self.has(TLS_KEY)):
            ca = pki.make_ca(self._ca_name(), self.options.days)
            leaf = pki.make_leaf(ca, self.options.days)
            self.write(CA_CERT, ca.cert)
            self.write(TLS_CERT, leaf.cert)
            self.write(TLS_KEY, leaf.key)
            if self.options.keep_ca_key:
                self.write(CA_KEY, ca.key)
            written += [CA_CERT, TLS_CERT, TLS_KEY]
        if not self.has(REDIS_PASSWORD):
            self.write(REDIS_PASSWORD, new_token() + "\n")
            written.append(REDIS_PASSWORD)
        if not self.has(REDIS_CONF) or REDIS_PASSWORD in written:
            self.write(REDIS_CONF, redis_conf(self.lines(REDIS_PASSWORD)))
            written.append(REDIS_CONF)
        if not self.has(KV_AUTH_KEY):
            self.write(KV_AUTH_KEY, secrets.token_hex(32) + "\n")
            written.append(KV_AUTH_KEY)
        return written

    # -- rotation ---------------------------------------------------------------------------
    def rotate_token(self, step: Step) -> None:
        self.write(TOKEN, "\n".join(_rotated(self.lines(TOKEN), step, TOKEN)) + "\n")

    def rotate_redis_password(self, step: Step) -> None:
        passwords = _rotated(self.lines(REDIS_PASSWORD), step, REDIS_PASSWORD)
        self.write(REDIS_PASSWORD, "\n".join(passwords) + "\n")
        self.write(REDIS_CONF, redis_conf(passwords))

    def rotate_kv_auth_key(self) -> None:
        """One rollout: chunks tagged with the old key are dropped on read (a cache refills)."""
        self.write(KV_AUTH_KEY, secrets.token_hex(32) + "\n")

    def renew_certificate(self) -> None:
        """A new certificate from the current CA (before the old one expires): one rollout."""
        self.write_leaf(self._ca(CA_KEY))

    def rotate_ca(self, step: Step) -> None:
        bundle = pki.certificates(self.read(CA_CERT))
        if step is Step.BEGIN:
            if len(bundle) != 1:
                raise RotationError("ca begin: the bundle already holds two CAs (switch or finish first)")
            new = pki.make_ca(self._ca_name(), self.options.days)
            self.write(NEXT_CA_KEY, new.key)
            self.write(CA_CERT, self.read(CA_CERT) + new.cert)  # trusted everywhere, unused
        elif step is Step.SWITCH:
            if len(bundle) != 2 or not self.has(NEXT_CA_KEY):
                raise RotationError("ca switch: begin first")
            new_cert = pem(bundle[1])
            self.write_leaf(pki.Pem(new_cert, self.read(NEXT_CA_KEY)))  # issued by the new CA
            self.write(CA_CERT, new_cert + pem(bundle[0]))
            if self.options.keep_ca_key:
                self.write(CA_KEY, self.read(NEXT_CA_KEY))
            self.path(NEXT_CA_KEY).unlink()
        else:
            if len(bundle) != 2:
                raise RotationError("ca finish: switch first")
            self.write(CA_CERT, pem(bundle[0]))

    def _ca_name(self) -> str:
        """Unique per CA: during a rotation two CAs are trusted at once, and TLS finds a
        certificate's issuer by name."""
        return f"{self.options.name} deployment CA {secrets.token_hex(4)}"

    def write_leaf(self, ca: pki.Pem) -> None:
        leaf = pki.make_leaf(ca, self.options.days)
        self.write(TLS_CERT, leaf.cert)
        self.write(TLS_KEY, leaf.key)

    def _ca(self, key_name: str) -> pki.Pem:
        if not self.has(key_name):
            raise RotationError(
                f"no {key_name} here: the certificate can only be renewed where the CA key is kept"
            )
        return pki.Pem(pem(pki.certificates(self.read(CA_CERT))[0]), self.read(key_name))


def _rotated(current: list[str], step: Step, what: str) -> list[str]:
    if step is Step.BEGIN:
        if len(current) != 1:
            raise RotationError(f"{what} begin: a rotation is under way (switch or finish it)")
        return [current[0], new_token()]  # the old one still sent first
    if len(current) != 2:
        raise RotationError(f"{what} {step.value}: begin first")
    if step is Step.SWITCH:
        return [current[1], current[0]]  # the new one sent, the old one still accepted
    return [current[0]]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def redis_conf(passwords: list[str]) -> str:
    """Redis's default user with every password (`>pw`), all commands and keys: Redis then
    refuses every client without one (NOAUTH)."""
    return "user default on " + " ".join(f">{p}" for p in passwords) + " ~* &* +@all\n"


def pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)
