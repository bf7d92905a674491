"""Cleave's gRPC services as child processes on loopback: started from their config types,
addressed through the port each one binds itself, ready when its gRPC health says so.

Each child gets `--port 0 --port-file F` (unless a port was asked for): it binds whatever
port the kernel gives and writes it to F, so no port is ever picked by one process and bound
by another. Children run `python -m MODULE` (their entry point: entry_points.py) with this
process's import path, so the same code and packages serve under `bazel run` and from a
checkout.

LocalStack.watch supervises them: a child that crashes is restarted (restarts.py) on the
address it had, which is the one the gateway's worker pool and the other services know.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.config.flags import render
from libs.config.groups import DEFAULT_SHUTDOWN_GRACE_S, GrpcSecurityFlags
from libs.rpc.channel import open_channel
from libs.rpc.ports import read_port_file
from libs.rpc.security import RpcSecurity, load_security
from libs.stack import process as processes
from libs.stack.metrics import GAVE_UP, RESTARTS
from libs.stack.process import LaunchError, ProcessSpec, RunningProcess
from libs.stack.restarts import RestartPolicy

log = structlog.get_logger(__name__)

PROGRESS_EVERY_S = 5.0


@dataclass
class Service:
    name: str
    role: str  # tokenizer, kvstore, encode, prefill, decode, both
    running: RunningProcess
    port_file: Path
    host: str = "127.0.0.1"
    ready: bool = False
    started_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None
    # How to start it again (start_service fills them in; without, it is never restarted).
    module: str = ""
    config: Any = None
    # What its health is checked with: its own --grpc-* TLS files (health needs no token).
    security: RpcSecurity = field(default_factory=RpcSecurity)
    # Supervision (LocalStack.watch): when it was restarted, when it is due again, whether
    # its last exit was dealt with.
    restarts: list[float] = field(default_factory=list)
    restart_at: float | None = None
    exit_handled: bool = False

    @property
    def port(self) -> int | None:
        return read_port_file(self.port_file)

    @property
    def address(self) -> str:
        port = self.port
        if port is None:
            raise LaunchError(f"{self.name} has not reported its port yet")
        return f"{self.host}:{port}"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.running.process

    def log_tail(self, lines: int = 40) -> str:
        return processes.log_tail(self.running.log_path, lines)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.running.stop(timeout_s)
        self.port_file.unlink(missing_ok=True)

    def kill(self) -> None:
        self.running.kill()

    def restart(self) -> None:
        """Starts it again, once it has exited, on the port it had. Its log goes on."""
        if self.config is None:
            raise LaunchError(f"{self.name} was not started from a config; it cannot be restarted")
        if self.running.exit_code() is None:
            raise LaunchError(f"{self.name} is still running")
        port = self.port
        config = replace(self.config, port=port) if port else self.config
        self.port_file.unlink(missing_ok=True)
        attempt = len(self.restarts)
        with self.running.log_path.open("a") as log_file:
            log_file.write(f"\n---- cleave: restarted by the local stack (restart {attempt}) ----\n")
        argv = processes.python_module(self.module, render(replace(config, port_file=self.port_file)))
        log_dir = self.running.log_path.parent
        self.running = processes.start(ProcessSpec(name=self.name, argv=argv), log_dir, append_log=True)
        self.ready = False
        self.started_at = time.monotonic()
        self.exit_handled = False
        log.info("restarted", service=self.name, pid=self.running.pid, port=port or "any", restart=attempt)

    def wait_bound(self, timeout_s: float = 120.0) -> str:
        """The address, once the child has bound its port (before it is ready to serve)."""
        deadline = time.monotonic() + timeout_s
        while self.port is None:
            code = self.running.exit_code()
            if code is not None:
                raise self.running.failure(f"exited with code {code} while starting")
            if time.monotonic() > deadline:
                raise self.running.failure(f"did not bind a port in {timeout_s:.0f}s")
            time.sleep(0.1)
        return self.address

    def wait_http_ready(self, timeout_s: float, *, health_path: str = "/ready", label: str = "") -> str:
        """For an HTTP server (the gateway): its base URL once `health_path` answers 200 (the
        gateway's /ready: its tokenizer and a worker for every role answer), read
        from the port it reported. Raises LaunchError, with its log's end, if it exits or the
        timeout passes; with a `label`, prints progress while models load."""
        last_report = self.started_at
        while True:
            code = self.running.exit_code()
            if code is not None:
                raise self.running.failure(f"exited with code {code} while starting")
            if self.port is not None:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://{self.address}{health_path}", timeout=2).status_code == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        return f"http://{self.address}"
            now = time.monotonic()
            if now - self.started_at > timeout_s:
                raise self.running.failure(f"not healthy after {timeout_s:.0f}s")
            if label and now - last_report >= PROGRESS_EVERY_S:
                elapsed = now - self.started_at
                print(
                    f"{label}: loading… {elapsed:.0f}s (log: {self.running.log_path})",
                    file=sys.stderr,
                    flush=True,
                )
                last_report = now
            time.sleep(0.5)

    async def check(self) -> bool:
        """True once serving; raises LaunchError (with its log's end) if the process died."""
        code = self.running.exit_code()
        if code is not None:
            raise self.running.failure(f"exited with code {code} while starting")
        if self.port is None:
            return False
        try:
            async with open_channel(self.address, security=self.security) as channel:
                response = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
        except grpc.aio.AioRpcError:
            return False
        if response.status == health_pb2.HealthCheckResponse.SERVING and not self.ready:
            self.ready = True
            self.ready_after_s = time.monotonic() - self.started_at
            log.info("ready", service=self.name, address=self.address, seconds=round(self.ready_after_s, 1))
        return self.ready


def start_service(name: str, role: str, module: str, config: Any, log_dir: Path) -> Service:
    """Starts `python -m module` with `config` rendered to flags. `config` is the service's
    frozen config type (it has `port` and `port_file`)."""
    # Named for the starting process too: two stacks sharing a cache (and so a log folder)
    # must never read each other's ports and wire themselves to the other's services.
    port_file = log_dir / f"{name}.{os.getpid()}.port"
    port_file.unlink(missing_ok=True)
    argv = processes.python_module(module, render(replace(config, port_file=port_file)))
    running = processes.start(ProcessSpec(name=name, argv=argv), log_dir)
    log.info("started", service=name, pid=running.pid, log=str(running.log_path))
    security = load_security(config, {}) if isinstance(config, GrpcSecurityFlags) else RpcSecurity()
    return Service(
        name, role, running, port_file, host=config.host, module=module, config=config, security=security
    )


async def wait_ready(services: list[Service], timeout_s: float, *, progress: bool = False) -> None:
    """Polls every service's health until all serve, printing progress while models load."""
    started = time.monotonic()
    last_report = 0.0
    while True:
        await asyncio.gather(*(s.check() for s in services if not s.ready))
        waiting = [s.name for s in services if not s.ready]
        if not waiting:
            return
        elapsed = time.monotonic() - started
        if progress and elapsed - last_report >= PROGRESS_EVERY_S:
            print(
                f"cleave: loading… {elapsed:.0f}s, waiting for {', '.join(waiting)}",
                file=sys.stderr,
                flush=True,
            )
            last_report = elapsed
        if elapsed > timeout_s:
            first = next(s for s in services if not s.ready)
            raise first.running.failure(f"not ready after {timeout_s:.0f}s")
        await asyncio.sleep(0.5)


@dataclass
class LocalStack:
    """Services started together, supervised while they run, stopped in reverse order."""

    log_dir: Path
    services: list[Service] = field(default_factory=list)
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    stopping: bool = False

    def start(self, name: str, role: str, module: str, config: Any) -> Service:
        service = start_service(name, role, module, config, self.log_dir)
        self.services.append(service)
        return service

    def addresses(self, role: str) -> list[str]:
        return [s.address for s in self.services if s.role == role]

    async def wait_ready(self, timeout_s: float, *, progress: bool = True) -> None:
        await wait_ready(self.services, timeout_s, progress=progress)

    async def watch(self, interval_s: float = 1.0) -> None:
        """Supervises the children until cancelled: see supervise_once."""
        while True:
            self.supervise_once(time.monotonic())
            await asyncio.sleep(interval_s)

    def supervise_once(self, now: float) -> None:
        """Reaps children that exited on their own and says so once, with the log to read;
        restarts one that crashed (a non-zero exit or a signal) after the policy's backoff,
        unless its restarts are spent. A child that exits 0 was told to stop: it stays down.

        The gateway keeps serving meanwhile (its pool ejects the worker and reinstates it when
        the restarted one answers on the same address).
        """
        if self.stopping:
            return
        for service in self.services:
            code = service.running.exit_code()
            if code is None:
                continue
            if not service.exit_handled:
                service.exit_handled = True
                self._on_exit(service, code, now)
            elif service.restart_at is not None and now >= service.restart_at:
                service.restart_at = None
                service.restarts.append(now)
                RESTARTS.labels(service.name).inc()
                try:
                    service.restart()
                except OSError as error:  # e.g. the log folder went away: try again later
                    log.error("restart failed", service=service.name, error=str(error))
                    service.exit_handled = False

    def _on_exit(self, service: Service, code: int, now: float) -> None:
        log.error("local service exited", service=service.name, code=code, log=str(service.running.log_path))
        # What it started is still in its process group (vLLM's engine outlives a SIGKILLed
        # worker, holding its cores and memory): gone now, not at the restart.
        service.kill()
        if code == 0 or service.config is None:
            return
        delay = self.restart_policy.delay(service.restarts, now)
        if delay is None:
            GAVE_UP.labels(service.name).inc()
            log.error(
                "not restarting: it crashed too often",
                service=service.name,
                restarts=self.restart_policy.max_restarts,
                window_s=self.restart_policy.window_s,
            )
            return
        service.restart_at = now + delay
        log.warning("restarting", service=service.name, in_s=delay)

    def stop(self, timeout_s: float = DEFAULT_SHUTDOWN_GRACE_S + 10) -> None:
        """SIGTERM every child at once (graceful drains overlap), then SIGKILL what is left by
        the deadline, vLLM's engines too: the children's own --shutdown-grace-s (their default)
        and the engines' exit fit in it. Nothing is restarted from here on."""
        self.stopping = True
        deadline = time.monotonic() + timeout_s
        known = [(s.running, s.running.begin_stop()) for s in reversed(self.services)]
        for running, descendants in known:
            running.finish_stop(descendants, max(0.1, deadline - time.monotonic()))
        for service in self.services:
            service.port_file.unlink(missing_ok=True)
        log.info("local stack stopped")
