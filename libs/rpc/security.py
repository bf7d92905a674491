"""TLS, mTLS and a shared bearer token for Cleave's gRPC servers and channels.

`load_security` turns the `--grpc-*` flags (file paths) into `RpcSecurity`, the material
itself, at a process's edge; servers and channels take only `RpcSecurity`. One setting
serves both sides, so a fleet is secured the same way everywhere:

- a certificate and key: servers serve TLS, and clients present them (for mTLS);
- a CA bundle: clients verify servers with it, and servers require client certificates
  signed by it (mTLS); clients use TLS whenever a CA or a certificate is given;
- a token: servers refuse calls without `authorization: Bearer <token>` (auth.py), and
  clients send it. A token file may hold several, one per line: clients send the first,
  servers accept any of them, which is how a token is rotated without a moment in which two
  services disagree (docs/deploy.md, "Rotation").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from libs.config.errors import ConfigError
from libs.config.groups import GrpcSecurityFlags

TOKEN_ENV = "CLEAVE_GRPC_TOKEN"
AUTHORIZATION = "authorization"  # gRPC metadata keys are lower case


@dataclass(frozen=True)
class RpcSecurity:
    """Loaded key material; never rendered, and kept out of reprs (so out of logs)."""

    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    ca_certificates: bytes | None = field(default=None, repr=False)
    server_name: str | None = None  # checked in servers' certificates instead of the host
    token: str | None = field(default=None, repr=False)  # what clients send
    # What servers accept besides `token` (the other lines of the token file).
    other_tokens: tuple[str, ...] = field(default=(), repr=False)

    @property
    def accepted_tokens(self) -> tuple[str, ...]:
        return (self.token, *self.other_tokens) if self.token else ()

    @property
    def tls(self) -> bool:
        """Whether clients connect with TLS."""
        return self.cert_chain is not None or self.ca_certificates is not None

    @property
    def server_transport(self) -> str:
        """What a server with this setting accepts: plaintext, tls or mtls (for logs)."""
        if self.cert_chain is None:
            return "plaintext"
        return "mtls" if self.ca_certificates is not None else "tls"

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS for a server (None = plaintext); with a CA, client certificates are required."""
        if self.cert_chain is None or self.private_key is None:
            return None
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.ca_certificates,
            require_client_auth=self.ca_certificates is not None,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS for a client (None = plaintext). Without a CA, the system's roots verify servers."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_certificates,
            private_key=self.private_key,
            certificate_chain=self.cert_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        if self.tls and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """What a client adds to each call (for clients that pass metadata per call)."""
        return ((AUTHORIZATION, f"Bearer {self.token}"),) if self.token else ()


def load_security(flags: GrpcSecurityFlags, environ: Mapping[str, str]) -> RpcSecurity:
    """The material the flags name; the token from `--grpc-token-file`, else from
    `environ[CLEAVE_GRPC_TOKEN]` (the edge passes os.environ). Raises ConfigError naming
    the flag of a missing or unusable file."""
    cert, key = flags.grpc_tls_cert_file, flags.grpc_tls_key_file
    if (cert is None) != (key is None):
        name = "--grpc-tls-cert-file" if key is None else "--grpc-tls-key-file"
        raise ConfigError(name, str(cert or key), "--grpc-tls-cert-file and --grpc-tls-key-file together")
    tokens = _tokens(flags.grpc_token_file, environ)
    return RpcSecurity(
        cert_chain=_read("--grpc-tls-cert-file", cert),
        private_key=_read("--grpc-tls-key-file", key),
        ca_certificates=_read("--grpc-tls-ca-file", flags.grpc_tls_ca_file),
        server_name=flags.grpc_tls_server_name,
        token=tokens[0] if tokens else None,
        other_tokens=tokens[1:],
    )


def _read(flag: str, path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(flag, str(path), f"a readable file ({error.strerror})") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(flag, str(path), "a PEM file")
    return data


def _tokens(path: Path | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The tokens of `--grpc-token-file` (one per line, the first is sent), else the one in
    `environ[CLEAVE_GRPC_TOKEN]`; () when neither is given."""
    if path is None:
        text = environ.get(TOKEN_ENV)
        if text is None:
            return ()
        source, value, tokens = TOKEN_ENV, "(environment)", [text.strip()]
    else:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError("--grpc-token-file", str(path), f"a readable text file ({error})") from None
        source, value = "--grpc-token-file", str(path)
        tokens = [line.strip() for line in text.splitlines() if line.strip()]
    # A token travels in an HTTP/2 header: visible ASCII only, and never echoed in errors.
    if not tokens or not all(token and all(33 <= ord(c) <= 126 for c in token) for token in tokens):
        raise ConfigError(source, value, "non-empty tokens of printable ASCII without spaces, one per line")
    return tuple(tokens)
