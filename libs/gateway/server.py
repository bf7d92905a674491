"""The gateway, put together: its config -> a local stack (unless given addresses) -> the fleet,
the serving room and the HTTP edge -> uvicorn. The one place that knows all three rooms."""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import cast

import uvicorn

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.config.roles import Role
from libs.gateway.api.app import create_app
from libs.gateway.api.context import ApiContext
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.http.request_deadline import RequestDeadline
from libs.gateway.api.images import encoder_stub
from libs.gateway.api_servers import inherited_listener, run_api_servers
from libs.gateway.common import vllm_metrics
from libs.gateway.common.deadline import DeadlineStub
from libs.gateway.config import GatewayConfig
from libs.gateway.fleet.admission import Admission
from libs.gateway.fleet.connect import connect_fleet
from libs.gateway.fleet.health_watch import WatchedHealth
from libs.gateway.fleet.kvstore_lookup import KvStoreLookup
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.fleet.routing.kv_events import KvEvents
from libs.gateway.serving.generate import Serving
from libs.gateway.serving.local_detokenize import load_decoder
from libs.planner import local_planner
from libs.rpc.channel import open_channel
from libs.rpc.ports import write_port_file
from libs.rpc.security import RpcSecurity
from libs.stack import local
from libs.stack.entry_points import EntryPoints, ServiceKind
from libs.stack.launcher import LocalStack


async def serve(
    config: GatewayConfig, edge: HttpEdge, security: RpcSecurity, entry_points: EntryPoints
) -> None:
    """`entry_points`: how the local stack starts each service (the services layer's registry).
    With --api-server-count N > 1, N gateway processes serve the API (api_servers.py)."""
    if config.listen_fd is not None:  # one of those N processes
        listener = inherited_listener(config.listen_fd)
    else:
        # Bound before the stack starts: the port is ours (and reported) while models load.
        listener = socket.create_server((config.host, config.port))
    port = listener.getsockname()[1]
    if config.port_file is not None:
        write_port_file(config.port_file, port)
    async with AsyncExitStack() as cleanup:
        cleanup.callback(listener.close)
        addresses, config, security, stack = await _services(config, security, entry_points, cleanup)
        if config.api_server_count > 1:
            print(
                f"cleave: serving at http://{config.host}:{port}/v1 with {config.api_server_count} "
                "API server processes",
                file=sys.stderr,
                flush=True,
            )
            await run_api_servers(config, addresses, listener, entry_points.module(ServiceKind.GATEWAY))
            return
        context, pool = await _context(config, security, addresses, cleanup)
        if config.planner and stack is not None and addresses.config is not None:
            planner = local_planner.planner_for_stack(
                config.planning,
                addresses.config,
                stack,
                pool,
                worker_module=entry_points.module(ServiceKind.WORKER),
                kvstore_address=addresses.kvstore,
                security=config,
            )
            task = local_planner.start(planner)
            cleanup.push_async_callback(planner.connector.close)
            cleanup.callback(task.cancel)
        app = create_app(context, edge)
        # Outermost: a request's deadline starts when it arrives (common/deadline.py).
        app.add_middleware(RequestDeadline, timeout_s=config.request_timeout_s)
        # SIGTERM: uvicorn stops accepting at once and lets the running requests end, for at
        # most the grace (then cancels them: their worker calls are cancelled, the engines abort).
        server = uvicorn.Server(
            uvicorn.Config(
                app, log_config=None, access_log=False, timeout_graceful_shutdown=config.http_shutdown_grace_s
            )
        )
        if config.listen_fd is None:  # the process that runs N says it once
            print(
                f"cleave: serving {context.model.model} at http://{config.host}:{port}/v1"
                + (f" (API key required: {len(edge.api_keys)} configured)" if edge.api_keys else ""),
                file=sys.stderr,
                flush=True,
            )
        await server.serve(sockets=[listener])


async def _services(
    config: GatewayConfig, security: RpcSecurity, entry_points: EntryPoints, cleanup: AsyncExitStack
) -> tuple[local.StackAddresses, GatewayConfig, RpcSecurity, LocalStack | None]:
    """The services' addresses: a local stack started for this gateway (returned too), or the
    ones given; the config and security with the stack's own gRPC token when it made one."""
    if not config.launches_stack:
        workers = {
            Role.PREFILL: config.prefill_workers,
            Role.DECODE: config.decode_workers,
            Role.BOTH: config.pd_workers,
        }
        addresses = local.StackAddresses(
            config.tokenizer or "",
            {role: list(given) for role, given in workers.items()},
            "",
            config.kvstore_address,
            config.encoders,
        )
        return addresses, config, security, None
    if config.grpc_stack_token and security.token is None:
        token_dir = Path(tempfile.mkdtemp(prefix="cleave-grpc-"))  # mode 0700
        cleanup.callback(shutil.rmtree, token_dir, ignore_errors=True)
        token_file = local.write_stack_token(token_dir)
        config = replace(config, grpc_token_file=token_file)
        security = replace(security, token=token_file.read_text())
    stack = LocalStack(config.log_dir)
    cleanup.callback(stack.stop)
    addresses = await local.launch(config, stack, entry_points=entry_points, security=config)
    watcher = asyncio.create_task(stack.watch())
    cleanup.callback(watcher.cancel)
    return addresses, config, security, stack


async def _context(
    config: GatewayConfig, security: RpcSecurity, addresses: local.StackAddresses, cleanup: AsyncExitStack
) -> tuple[ApiContext, WorkerPool]:
    fleet = await connect_fleet(
        cleanup,
        addresses.workers,
        served_model=addresses.served_model,
        security=security,
        breaker=config.breaker(),
        # The local stack's workers listen on IP literals: nothing to look up.
        worker_dns_refresh_s=0.0 if config.launches_stack else config.worker_dns_refresh_s,
        # The local stack's workers already serve; given ones may still be loading.
        wait_for_workers_s=0.0 if config.launches_stack else config.wait_for_workers_s,
        shared_streams=config.worker_streams == "shared",
        # The policy routes on the engines' KV events: follow them.
        watch_kv_cache=config.routing == KvEvents.name,
    )
    # vLLM's token-count histograms are bucketed by the model's context length.
    vllm_metrics.configure(fleet.facts.current.max_model_len)
    tokenizer_channel = open_channel(addresses.tokenizer, security=security)
    cleanup.push_async_callback(tokenizer_channel.close)
    tokenizer_health = WatchedHealth(tokenizer_channel, addresses.tokenizer)
    tokenizer_health.start()
    cleanup.callback(tokenizer_health.close)
    # Generated text is detokenized here when the tokenizer hands out its decoder.
    decoder = await load_decoder(tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel))
    # Every tokenizer call gets the request's remaining time as its deadline (common/deadline.py).
    tokenizer = cast(
        tokenizer_pb2_grpc.TokenizerStub, DeadlineStub(tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel))
    )
    lookup = None
    if addresses.kvstore:
        # The workers' layout keys the kvstore's chunks; the gateway asks with the same one.
        lookup = KvStoreLookup(addresses.kvstore, fleet.first.kv_layout, security=security)
        cleanup.push_async_callback(lookup.close)
    serving = Serving(
        fleet.pool,
        tokenizer,
        create_policy(config.routing),
        create_policy(config.routing),
        prefix_lookup=lookup,
        migration_limit=config.migration_limit,
        request_timeout_s=config.request_timeout_s,
        admission=Admission(fleet.pool, config.admission()),
        decoder=decoder,
        disagg=config.disagg(),
    )
    await tokenizer_health.wait_heard(timeout_s=5.0)
    context = ApiContext(
        serving,
        fleet.facts,
        fleet.pool,
        tokenizer,
        tokenizer_health,
        config.api_options(),
        encoder=encoder_stub(addresses.encoders, security),
        decoder=decoder,
        adapters=config.adapters(),
    )
    return context, fleet.pool
