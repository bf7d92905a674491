"""The HEALTHCHECK of Cleave's images: is the service in this container serving?

    python3 /opt/cleave/healthcheck.py grpc            # tokenizer, worker, kvstore
    python3 /opt/cleave/healthcheck.py http --path /health --default-port 8000   # gateway

The image's ENTRYPOINT is the service itself, so the flags it was started with are PID 1's
command line: the probe reads `--port`/`--host`/`--port-file` there instead of asking the
operator to repeat them. gRPC: the standard health service's overall status ("") must be
SERVING (a worker answers NOT_SERVING while its model loads). HTTP: the path must answer 200.
Exit 0 = healthy, 1 = not. Runs on the image's python3 with the image's packages (grpcio).
"""

from __future__ import annotations

import argparse
import sys
import urllib.request
from pathlib import Path

SITE = "/opt/cleave/app.runfiles/pypi/site"
_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def flag_value(argv: list[str], name: str) -> str | None:
    """The last value of `--name V` or `--name=V` in argv (the last one wins, as argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def target(argv: list[str], default_port: int | None) -> tuple[str, int]:
    """Where the service started with `argv` listens, as an address to connect to."""
    host = flag_value(argv, "--host") or "127.0.0.1"
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    port_text = flag_value(argv, "--port")
    port = int(port_text) if port_text is not None else default_port
    port_file = flag_value(argv, "--port-file")
    if not port and port_file:
        port = int(Path(port_file).read_text().strip())
    if not port:
        raise ValueError("the service was started without --port (or --port-file): nothing to probe")
    return host, port


def probe_grpc(host: str, port: int, timeout_s: float) -> bool:
    sys.path.insert(0, SITE)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as error:
            print(f"gRPC health {host}:{port}: {error.code().name}", file=sys.stderr)
            return False
    print(f"gRPC health {host}:{port}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def probe_http(host: str, port: int, path: str, timeout_s: float) -> bool:
    url = f"http://{host}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            print(f"GET {url}: {reply.status}")
            return reply.status == 200
    except OSError as error:
        print(f"GET {url}: {error}", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["grpc", "http"])
    parser.add_argument(
        "--default-port", type=int, default=None, help="the service's port when no --port is given"
    )
    parser.add_argument("--path", default="/health", help="HTTP path that answers 200 when healthy")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument(
        "--cmdline", default="/proc/1/cmdline", help="the service's command line (NUL-separated)"
    )
    args = parser.parse_args(argv)
    service_argv = Path(args.cmdline).read_bytes().decode(errors="replace").split("\0")
    try:
        host, port = target(service_argv, args.default_port)
    except (ValueError, OSError) as error:
        print(f"healthcheck: {error}", file=sys.stderr)
        return 1
    if args.kind == "grpc":
        healthy = probe_grpc(host, port, args.timeout)
    else:
        healthy = probe_http(host, port, args.path, args.timeout)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
