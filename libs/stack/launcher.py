"""Starts a local Cleave stack as child processes on loopback and stops it cleanly.

Used by the gateway when it is given no worker addresses: one command, a working stack.
Children run `python -m services.<name>.main` with this process's import path, so the same
code and packages serve whether the gateway runs under `bazel run` or from a checkout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = structlog.get_logger(__name__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    name: str
    role: str  # tokenizer, prefill, decode, both
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    ready: bool = False


@dataclass
class LocalStack:
    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, role: str, module: str, args: Sequence[str], port: int) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with log_path.open("wb") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
            )
        child = Child(name, role, f"127.0.0.1:{port}", process, log_path)
        self.children.append(child)
        log.info("started", service=name, pid=process.pid, log=str(log_path))
        return child

    def addresses(self, role: str) -> list[str]:
        return [c.address for c in self.children if c.role == role]

    async def wait_ready(self, timeout_s: float) -> None:
        """Polls every child's gRPC health, printing progress while models load."""
        started = time.monotonic()
        last_report = 0.0
        while True:
            await asyncio.gather(*(self._check(c) for c in self.children if not c.ready))
            waiting = [c.name for c in self.children if not c.ready]
            if not waiting:
                return
            elapsed = time.monotonic() - started
            if elapsed - last_report >= 5:
                print(
                    f"cleave: loading… {elapsed:.0f}s, waiting for {', '.join(waiting)}",
                    file=sys.stderr,
                    flush=True,
                )
                last_report = elapsed
            if elapsed > timeout_s:
                raise TimeoutError(
                    f"not ready after {timeout_s:.0f}s: {', '.join(waiting)}; see logs in {self.log_dir}"
                )
            await asyncio.sleep(0.5)

    async def _check(self, child: Child) -> None:
        code = child.process.poll()
        if code is not None:
            tail = "\n".join(child.log_path.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"{child.name} exited with code {code} while starting:\n{tail}")
        try:
            async with grpc.aio.insecure_channel(child.address) as channel:
                response = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
            child.ready = response.status == health_pb2.HealthCheckResponse.SERVING
            if child.ready:
                log.info("ready", service=child.name, address=child.address)
        except grpc.aio.AioRpcError:
            pass

    async def watch(self, interval_s: float = 1.0) -> None:
        """Reaps children that exit on their own and says so once, with the log to read.

        The gateway keeps serving (its pool ejects the worker); without this the dead child
        would linger as a zombie and nobody would be told where its last words are.
        """
        reported: set[str] = set()
        while True:
            for child in self.children:
                code = child.process.poll()
                if code is not None and child.name not in reported:
                    reported.add(child.name)
                    log.error("local service exited", service=child.name, code=code, log=str(child.log_path))
            await asyncio.sleep(interval_s)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every child (graceful drain), then SIGKILL what is left, groups included."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("child did not stop in time; killing", service=child.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)  # vLLM's engine processes too
            child.process.wait()
        log.info("local stack stopped")
