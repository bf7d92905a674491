"""Run inside a probe container on a compose stack's network (live_security.py): calls gRPC
methods the way another container on that network could, and prints one JSON line per call
with the status it got. grpcio from the image's packages layer.

    python3 grpc_auth_probe.py MODE@host:port=/pkg.Service/Method ...

MODE: `plaintext` (no certificate: a container without the stack's secrets), `mtls` (the
stack's certificate, no token), `mtls+token` (both: the control that the others fail for want
of them). Certificates and token from /etc/cleave/secrets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc

SECRETS = Path("/etc/cleave/secrets")


def channel(mode: str, target: str) -> grpc.Channel:
    if mode == "plaintext":
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(SECRETS / "ca.crt").read_bytes(),
        private_key=(SECRETS / "tls.key").read_bytes(),
        certificate_chain=(SECRETS / "tls.crt").read_bytes(),
    )
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "cleave")])


def call(mode: str, target: str, method: str) -> str:
    metadata = []
    if mode == "mtls+token":
        token = (SECRETS / "grpc-token").read_text().split()[0]
        metadata.append(("authorization", f"Bearer {token}"))
    with channel(mode, target) as open_channel:
        stub = open_channel.unary_unary(
            method, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            stub(b"", timeout=30, metadata=metadata)
        except grpc.RpcError as error:
            return str(error.code().name)
    return "OK"


def main(argv: list[str]) -> int:
    for spec in argv:
        mode, _, rest = spec.partition("@")
        target, _, method = rest.partition("=")
        print(
            json.dumps(
                {"mode": mode, "target": target, "method": method, "status": call(mode, target, method)}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
