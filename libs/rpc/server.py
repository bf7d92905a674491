"""A grpc.aio server with what every Cleave service needs: health, request ids, message
limits, optional TLS/mTLS and bearer token (security.py, auth.py), reflection only when asked
for, the health service alone on a plaintext port for probes (--health-port), and a graceful
shutdown that stops advertising health before draining.

Shutdown (`serve_until_signal`), within `shutdown_grace_s` of the SIGTERM: health says
NOT_SERVING at once (a router watching it stops sending work), the service's own `drain`
runs (a worker finishes or hands off its requests: libs/worker/drain.py), then the server
stops, giving calls still open what is left of the grace."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from libs.config.groups import DEFAULT_SHUTDOWN_GRACE_S
from libs.rpc.auth import TokenAuthServerInterceptor
from libs.rpc.health import HealthServicer
from libs.rpc.options import RpcOptions
from libs.rpc.ports import write_port_file
from libs.rpc.request_id import RequestIdServerInterceptor
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# A replicated service's clients (channel.py: round_robin over every address its name resolves
# to) learn of a replica added later only when they resolve the name again, which gRPC does
# when a connection ends. Ending each connection after five minutes lets new replicas take
# their share within that; running calls are never cut. Workers are not replicated this way:
# the gateway finds them by its own DNS refresh, and their GenerateMany call lives long.
REPLICA_CONNECTION_AGE_MS = 300_000


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port; GrpcServer.port tells which
    # Where to write the bound port once listening (launchers read it; see ports.py).
    port_file: Path | None = None
    rpc: RpcOptions = field(default_factory=RpcOptions)
    # Seconds from a stop request to the end (--shutdown-grace-s): the service's drain and
    # the calls still open share it.
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    # Off by default: reflection hands any caller the full API (--grpc-reflection).
    reflection: bool = False
    security: RpcSecurity = field(default_factory=RpcSecurity)
    # The health service alone, plaintext and without the token, on this port (--health-port):
    # for probes that cannot speak TLS or send metadata (Kubernetes' grpc probe). It tells only
    # whether the server serves, as the health service on the main port does to anyone.
    health_port: int | None = None

    @classmethod
    def of(cls, flags: ServingFlags, security: RpcSecurity, *, replicated: bool = False) -> ServerConfig:
        """The config a service's flags (ServerFlags, GrpcServingFlags, --grpc-reflection) say.
        `replicated`: a stateless service that may run as several replicas behind one name
        (tokenizer, encoder, kvstore), whose connections are renewed now and then."""
        return cls(
            rpc=RpcOptions(max_connection_age_ms=REPLICA_CONNECTION_AGE_MS if replicated else None),
            host=flags.host,
            port=flags.port,
            port_file=flags.port_file,
            shutdown_grace_s=flags.shutdown_grace_s,
            reflection=flags.grpc_reflection,
            security=security,
            health_port=flags.health_port,
        )


class ServingFlags(Protocol):
    """What ServerConfig.of reads of a service's (frozen) config."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def port_file(self) -> Path | None: ...
    @property
    def shutdown_grace_s(self) -> float: ...
    @property
    def grpc_reflection(self) -> bool: ...
    @property
    def health_port(self) -> int | None: ...


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
            interceptors.insert(0, TokenAuthServerInterceptor(config.security.accepted_tokens))
        self._server = grpc.aio.server(options=config.rpc.as_grpc_options(), interceptors=interceptors)
        self._health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in self._services:
            service.add_to_server(service.servicer, self._server)
        if config.reflection:
            names = [s.full_name for s in self._services]
            names += [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
            reflection.enable_server_reflection(names, self._server)
        self._health_server: grpc.aio.Server | None = None
        if config.health_port is not None:
            # The same servicer: both ports say the same, and a drain is seen on both.
            self._health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
        self._port = 0
        self._draining = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def config(self) -> ServerConfig:
        return self._config

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
        if self._health_server is not None:
            health_where = f"{self._config.host}:{self._config.health_port}"
            if self._health_server.add_insecure_port(health_where) == 0:
                raise OSError(f"could not bind the gRPC health port {health_where}")
            await self._health_server.start()
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
            health_port=self._config.health_port,
        )

    async def set_serving(self, serving: bool) -> None:
        """Health of the whole server ("") and of each service."""
        status = SERVING if serving else NOT_SERVING
        for name in ["", *(s.full_name for s in self._services)]:
            await self._health.set(name, status)

    @property
    def draining(self) -> bool:
        return self._draining

    async def begin_drain(self) -> None:
        """Health says NOT_SERVING from now on, to checks and to watchers at once (a later
        set_serving(True) is ignored); the server still takes calls until stop()."""
        self._draining = True
        await self._health.enter_graceful_shutdown()

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING first, so health-checking routers stop sending new work; then new
        calls are refused and open ones get `grace_s` (default: the whole shutdown grace)."""
        await self.begin_drain()
        grace = self._config.shutdown_grace_s if grace_s is None else max(grace_s, 0.0)
        await self._server.stop(grace)
        if self._health_server is not None:
            await self._health_server.stop(0)
        log.info("grpc server stopped", address=self.address)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


# Of the shutdown grace, what the server keeps for its own stop (open calls closing, the
# process exiting) after the service's drain: this much, or a fifth of the grace if less.
STOP_RESERVE_S = 5.0
# After a drain, how long calls still open get before they are cancelled.
STOP_GRACE_AFTER_DRAIN_S = 1.0

# A service's drain: given the loop time by which it must have returned, it finishes (or
# hands off) its work; the server stops after it.
Drain = Callable[[float], Awaitable[None]]


def drain_deadline(started: float, grace_s: float) -> float:
    """When a drain that started at `started` must end, leaving the stop its reserve."""
    return started + grace_s - min(STOP_RESERVE_S, grace_s / 5)


async def serve_until_signal(
    server: GrpcServer,
    on_started: Callable[[], None] | None = None,
    load: Callable[[], Awaitable[None]] | None = None,
    drain: Drain | None = None,
) -> None:
    """Starts the server and runs until SIGINT/SIGTERM, then stops it gracefully.

    With `load`, the port is bound (and reported) first and health says NOT_SERVING until
    `load` (a model, an engine) has finished: see deferred.py. With `drain`, a stop first
    says NOT_SERVING, then awaits `drain(deadline)`, then stops the server with what is left
    of the grace.
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
    await drain_and_stop(server, drain)


async def drain_and_stop(server: GrpcServer, drain: Drain | None = None) -> None:
    """The graceful stop, within the server's shutdown grace (see serve_until_signal)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    grace = server.config.shutdown_grace_s
    log.info("shutdown requested", grace_s=grace)
    await server.begin_drain()
    stop_grace = started + grace - loop.time()
    if drain is not None:
        deadline = drain_deadline(started, grace)
        try:
            async with asyncio.timeout_at(deadline):
                await drain(deadline)
        except TimeoutError:
            log.warning("the drain did not end within its share of the shutdown grace", grace_s=grace)
        # The service's work has ended or been handed off; what is still open are calls that
        # carry none (a stats poll). The rest of the reserve is the service's own shutdown's
        # (a worker's engine), so the process exits within the grace.
        stop_grace = min(STOP_GRACE_AFTER_DRAIN_S, started + grace - loop.time())
    await server.stop(stop_grace)
    log.info("stopped", seconds=round(loop.time() - started, 2))
