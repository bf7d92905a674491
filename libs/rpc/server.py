"""A grpc.aio server with what every Cleave service needs: health, request ids, message
limits, optional TLS/mTLS and bearer token (security.py, auth.py), reflection only when asked
for, and a graceful shutdown that stops advertising health before draining."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from libs.rpc.auth import TokenAuthServerInterceptor
from libs.rpc.options import RpcOptions
from libs.rpc.ports import write_port_file
from libs.rpc.request_id import RequestIdServerInterceptor
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port; GrpcServer.port tells which
    # Where to write the bound port once listening (launchers read it; see ports.py).
    port_file: Path | None = None
    rpc: RpcOptions = field(default_factory=RpcOptions)
    # How long in-flight RPCs may finish after a stop is requested.
    shutdown_grace_s: float = 10.0
    # Off by default: reflection hands any caller the full API (--grpc-reflection).
    reflection: bool = False
    security: RpcSecurity = field(default_factory=RpcSecurity)


@dataclass(frozen=True)
class ServiceBinding:
    """A servicer plus the generated function that registers it and its full name."""

    full_name: str  # e.g. "cleave.worker.v1.Worker"
    servicer: Any
    add_to_server: Callable[[Any, grpc.aio.Server], None]


class GrpcServer:
    def __init__(self, config: ServerConfig, services: Sequence[ServiceBinding]) -> None:
        self._config = config
        self._services = tuple(services)
        interceptors: list[grpc.aio.ServerInterceptor] = [RequestIdServerInterceptor()]
        if config.security.token:
            # First, so nothing runs for a call that is refused.
            interceptors.insert(0, TokenAuthServerInterceptor(config.security.token))
        self._server = grpc.aio.server(options=config.rpc.as_grpc_options(), interceptors=interceptors)
        self._health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in self._services:
            service.add_to_server(service.servicer, self._server)
        if config.reflection:
            names = [s.full_name for s in self._services]
            names += [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
            reflection.enable_server_reflection(names, self._server)
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self._config.host}:{self._port}"

    async def start(self, *, serving: bool = True) -> None:
        """Binds and starts; `serving=False` answers health NOT_SERVING until set_serving."""
        where = f"{self._config.host}:{self._config.port}"
        credentials = self._config.security.server_credentials()
        if credentials is None:
            self._port = self._server.add_insecure_port(where)
        else:
            self._port = self._server.add_secure_port(where, credentials)
        if self._port == 0:
            raise OSError(f"could not bind gRPC server to {self._config.host}:{self._config.port}")
        await self._server.start()
        await self.set_serving(serving)
        if self._config.port_file is not None:
            write_port_file(self._config.port_file, self._port)
        log.info(
            "grpc server started",
            address=self.address,
            services=[s.full_name for s in self._services],
            transport=self._config.security.server_transport,
            token=bool(self._config.security.token),
            reflection=self._config.reflection,
        )

    async def set_serving(self, serving: bool) -> None:
        """Health of the whole server ("") and of each service."""
        status = SERVING if serving else NOT_SERVING
        for name in ["", *(s.full_name for s in self._services)]:
            await self._health.set(name, status)

    async def stop(self) -> None:
        # Report NOT_SERVING first so health-checking routers stop sending new work, then
        # let in-flight calls drain for the grace period.
        await self._health.enter_graceful_shutdown()
        await self._server.stop(self._config.shutdown_grace_s)
        log.info("grpc server stopped", address=self.address)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def serve_until_signal(
    server: GrpcServer,
    on_started: Callable[[], None] | None = None,
    load: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Starts the server and runs until SIGINT/SIGTERM, then stops it gracefully.

    With `load`, the port is bound (and reported) first and health says NOT_SERVING until
    `load` (a model, an engine) has finished: see deferred.py.
    """
    await server.start(serving=load is None)
    if load is not None:
        # A signal during the load keeps its default action (the process ends at once).
        await load()
        await server.set_serving(True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if on_started is not None:
        on_started()
    await stop.wait()
    log.info("shutdown requested")
    await server.stop()
