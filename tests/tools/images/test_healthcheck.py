"""The images' HEALTHCHECK probe: where it looks, and what it answers for live and dead
services (a real gRPC health server and a real HTTP server on loopback)."""

from __future__ import annotations

import http.server
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tools.images import healthcheck


def test_target_reads_the_services_own_flags() -> None:
    argv = ["/sbin/docker-init", "--", "python3", "/opt/x/gateway", "--host=0.0.0.0", "--port", "8001"]
    assert healthcheck.target(argv, default_port=8000) == ("127.0.0.1", 8001)
    assert healthcheck.target(["svc", "--host", "10.1.2.3", "--port=7"], None) == ("10.1.2.3", 7)
    assert healthcheck.target(["svc", "--port", "5", "--port", "6"], None) == ("127.0.0.1", 6)
    assert healthcheck.target(["gateway"], default_port=8000) == ("127.0.0.1", 8000)


def test_a_health_port_is_probed_instead_of_the_main_one() -> None:
    # With mTLS on --port, only the plaintext health port answers a probe.
    argv = ["worker", "--host=0.0.0.0", "--port=50060", "--health-port", "50090"]
    assert healthcheck.target(argv, None) == ("127.0.0.1", 50090)


def test_target_falls_back_to_the_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    port_file.write_text("4242\n")
    assert healthcheck.target(["svc", "--port", "0", "--port-file", str(port_file)], None) == (
        "127.0.0.1",
        4242,
    )
    with pytest.raises(ValueError, match="--port"):
        healthcheck.target(["svc"], None)


def _cmdline(tmp_path: Path, *argv: str) -> str:
    path = tmp_path / "cmdline"
    path.write_bytes("\0".join(argv).encode() + b"\0")
    return str(path)


def test_grpc_probe_follows_the_health_service(tmp_path: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        cmdline = _cmdline(tmp_path, "python3", "worker", "--host=0.0.0.0", f"--port={port}")
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main(["grpc", "--cmdline", cmdline]) == 1
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main(["grpc", "--cmdline", cmdline]) == 0
    finally:
        server.stop(None)
    assert healthcheck.main(["grpc", "--cmdline", cmdline, "--timeout", "1"]) == 1


def test_http_probe_needs_a_200(tmp_path: Path) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        cmdline = _cmdline(tmp_path, "python3", "gateway", "--port", str(port))
        assert healthcheck.main(["http", "--cmdline", cmdline]) == 0
        assert healthcheck.main(["http", "--path", "/ready", "--cmdline", cmdline]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert healthcheck.main(["http", "--cmdline", cmdline, "--timeout", "1"]) == 1
