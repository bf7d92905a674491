"""The HEALTHCHECK of Cleave's images: is the service in this container serving?

    python3 /opt/cleave/healthcheck.py grpc            # tokenizer, worker, kvstore
    python3 /opt/cleave/healthcheck.py http --path /health --default-port 8000   # gateway

The image's ENTRYPOINT is the service itself, so the flags it was started with are PID 1's
command line: the probe reads `--health-port` (else `--port`/`--port-file`) and `--host` there
instead of asking the operator to repeat them. gRPC: the standard health service's overall status ("") must be
SERVING (a worker answers NOT_SERVING while its model loads). HTTP: the path must answer 200.
Exit 0 = healthy, 1 = not. Standard library only (runs on the image's bare python3).
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.request
from pathlib import Path

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
    """Where the service started with `argv` listens, as an address to connect to: its
    --health-port when it has one (the health service alone, in plaintext: the main port of a
    deployment with mTLS takes no plaintext caller), else its --port."""
    host = flag_value(argv, "--host") or "127.0.0.1"
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    health_port = flag_value(argv, "--health-port")
    if health_port:
        return host, int(health_port)
    port_text = flag_value(argv, "--port")
    port = int(port_text) if port_text is not None else default_port
    port_file = flag_value(argv, "--port-file")
    if not port and port_file:
        port = int(Path(port_file).read_text().strip())
    if not port:
        raise ValueError("the service was started without --port (or --port-file): nothing to probe")
    return host, port


def probe_grpc(host: str, port: int, timeout_s: float) -> bool:
    """grpc.health.v1.Health/Check("") over a bare HTTP/2 connection: importing grpcio takes
    seconds in a CPU-starved container, longer than a health check's timeout."""
    try:
        status = grpc_health_status(host, port, timeout_s)
    except OSError as error:
        print(f"gRPC health {host}:{port}: {error}", file=sys.stderr)
        return False
    print(f"gRPC health {host}:{port}: {_STATUS_NAMES.get(status, status)}")
    return status == _SERVING


_SERVING = 1
_STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN", None: "no answer"}
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _literal(name_index: int, value: str, prefix_bits: int = 4) -> bytes:
    # HPACK "literal header field without indexing", indexed name, raw (not Huffman) value.
    limit = (1 << prefix_bits) - 1
    head = bytes([name_index]) if name_index < limit else bytes([limit, name_index - limit])
    return head + bytes([len(value)]) + value.encode()


def grpc_health_status(host: str, port: int, timeout_s: float) -> int | None:
    """The overall ("") serving status, or None when the call got no message back."""
    headers = (
        b"\x83\x86"  # :method POST, :scheme http (HPACK static table)
        + _literal(4, "/grpc.health.v1.Health/Check")
        + _literal(1, f"{host}:{port}")
        + _literal(31, "application/grpc")
        + b"\x00"
        + bytes([2])
        + b"te"
        + bytes([8])
        + b"trailers"
    )
    request = b"\x00\x00\x00\x00\x00"  # uncompressed, empty HealthCheckRequest
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.settimeout(timeout_s)
        conn.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _frame(_SETTINGS, 0, 0)
            + _frame(_HEADERS, _END_HEADERS, 1, headers)
            + _frame(_DATA, _END_STREAM, 1, request)
        )
        reader = conn.makefile("rb")
        data = b""
        while True:
            head = reader.read(9)
            if len(head) < 9:
                break
            length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = reader.read(length)
            if kind == _SETTINGS and not flags & _ACK:
                conn.sendall(_frame(_SETTINGS, _ACK, 0))
            elif kind == _PING and not flags & _ACK:
                conn.sendall(_frame(_PING, _ACK, 0, payload))
            elif kind == _DATA and stream == 1:
                data += payload
            if kind in (_RST_STREAM, _GOAWAY) or (
                stream == 1 and kind in (_DATA, _HEADERS) and flags & _END_STREAM
            ):
                break
    # One gRPC message: flag byte, 4-byte length, then HealthCheckResponse {status = 1 (varint)}.
    message = data[5 : 5 + int.from_bytes(data[1:5], "big")] if len(data) >= 5 else None
    if message is None:
        return None
    if len(message) >= 2 and message[0] == 0x08:
        return message[1]
    return 0  # an empty message: status left at its default, UNKNOWN


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
