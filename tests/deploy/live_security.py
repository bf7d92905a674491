"""The security check on a live compose stack (compose_live_checks.py): from a container on the
stack's network, every gRPC service refuses a caller without the stack's certificate (the TLS
handshake fails: UNAVAILABLE) and one with the certificate but without the token
(UNAUTHENTICATED), and answers one with both; each health port answers plaintext; Redis refuses
a client without its password (NOAUTH) and answers one with it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.deploy.live_stack import CheckFailed, Stack, log

PROBE = Path(__file__).with_name("grpc_auth_probe.py")
PYTHONPATH = "/opt/cleave/app.runfiles/pypi/site"  # the images' packages layer (grpcio)
HEALTH_PORT = 50090
# Image -> (port, a method every caller with the token may call).
METHODS = {
    "cleave-tokenizer": (50051, "/cleave.tokenizer.v1.Tokenizer/GetInfo"),
    "cleave-kvstore": (50052, "/cleave.kvstore.v1.KvStore/GetStats"),
    "cleave-worker": (50060, "/cleave.worker.v1.Worker/GetInfo"),
    "cleave-encoder": (50053, "/cleave.encoder.v1.Encoder/GetInfo"),
}
EXPECTED = {"plaintext": "UNAVAILABLE", "mtls": "UNAUTHENTICATED", "mtls+token": "OK"}


def check_security(stack: Stack, args: argparse.Namespace) -> None:
    targets = {service: METHODS[image] for service, image in stack.grpc_services().items()}
    calls = [
        f"{mode}@{service}:{port}={method}"
        for service, (port, method) in targets.items()
        for mode in EXPECTED
    ]
    calls += [f"plaintext@{service}:{HEALTH_PORT}=/grpc.health.v1.Health/Check" for service in targets]
    output = stack.probe_container(
        "-v", f"{PROBE}:/probe.py:ro", "-e", f"PYTHONPATH={PYTHONPATH}", "--entrypoint", "python3",
        f"cleave-kvstore:{stack.tag}", "/probe.py", *calls,
    )  # fmt: skip
    results = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    wrong = []
    for result in results:
        want = "OK" if result["method"].startswith("/grpc.health") else EXPECTED[result["mode"]]
        if result["status"] != want:
            wrong.append(result)
    if len(results) != len(calls) or wrong:
        raise CheckFailed(f"security: {len(results)} of {len(calls)} calls answered; unexpected: {wrong}")
    log(
        f"security: {len(targets)} gRPC services ({', '.join(sorted(targets))}): without the certificate "
        "UNAVAILABLE (no TLS handshake), with it but no token UNAUTHENTICATED, with both OK; "
        "health ports answer plaintext"
    )
    redis = stack.probe_container(
        "--entrypoint", "sh", f"cleave-kvstore:{stack.tag}", "-c",
        "redis-cli -h redis ping; "
        'REDISCLI_AUTH="$(head -n 1 /etc/cleave/secrets/redis-password)" redis-cli -h redis ping',
    ).splitlines()  # fmt: skip
    redis = [line.strip() for line in redis if line.strip()]  # redis-cli ends an error with a blank line
    if not (len(redis) == 2 and "NOAUTH" in redis[0] and redis[1] == "PONG"):
        raise CheckFailed(f"security: redis without then with its password answered {redis[:2]}")
    log(f"security: redis without its password: {redis[0]!r}; with it: {redis[1]!r}")
