"""Starts real Cleave services as child processes on loopback for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """The test's own import path, so `python -m services...` finds the same packages."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def log_dir() -> Path:
    folder = Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp")) / "service-logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Service:
    name: str
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.perf_counter)
    ready_after_s: float | None = None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def rss_mib(self) -> float:
        """Resident memory of the service and all its children (vLLM's engine core, workers)."""
        root = psutil.Process(self.process.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total / 2**20

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group (vLLM children included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_module(name: str, module: str, args: list[str], port: int) -> Service:
    path = log_dir() / f"{name}.log"
    handle = path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=child_env(),
        start_new_session=True,  # its own process group, so kill() reaches vLLM's children
    )
    return Service(name=name, address=f"127.0.0.1:{port}", process=process, log_path=path)


async def wait_healthy(service: Service, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise RuntimeError(
                    f"{service.name} exited with {service.process.returncode}:\n{service.log_tail()}"
                )
            try:
                response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    service.ready_after_s = time.perf_counter() - service.started_at
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{service.name} not healthy after {timeout_s}s:\n{service.log_tail()}")
