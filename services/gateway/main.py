"""Entry point of the Cleave gateway: config -> local stack (unless given addresses) -> HTTP.

./bazel run //services/gateway                  # local 1p1d stack with SmolLM2, then serve
./bazel run //services/gateway -- --mode pd     # colocated
./bazel run //services/gateway -- --tokenizer H:P --prefill-workers H:P --decode-workers H:P
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import uvicorn

from libs.config.errors import ConfigError
from libs.encoder.limits import ImageLimits
from libs.gateway.assembly import assemble
from libs.gateway.deadline import RequestDeadline
from libs.gateway.edge import HttpEdge
from libs.gateway.images import encoder_stub
from libs.models.errors import ModelNotFoundError
from libs.observability.logging import configure_logging
from libs.rpc.ports import write_port_file
from libs.rpc.security import RpcSecurity, load_security
from libs.stack import local
from libs.stack.launcher import LocalStack
from libs.stack.process import LaunchError
from services.gateway.app import GatewayState, create_app
from services.gateway.config import GatewayConfig, parse_args


async def serve(config: GatewayConfig, edge: HttpEdge, security: RpcSecurity) -> None:
    # Bound before the stack starts: the port is ours (and reported) while models load.
    listener = socket.create_server((config.host, config.port))
    port = listener.getsockname()[1]
    if config.port_file is not None:
        write_port_file(config.port_file, port)
    async with AsyncExitStack() as cleanup:
        cleanup.callback(listener.close)
        if config.launches_stack:
            if config.grpc_stack_token and security.token is None:
                token_dir = Path(tempfile.mkdtemp(prefix="cleave-grpc-"))  # mode 0700
                cleanup.callback(shutil.rmtree, token_dir, ignore_errors=True)
                token_file = local.write_stack_token(token_dir)
                config = replace(config, grpc_token_file=token_file)
                security = replace(security, token=token_file.read_text())
            stack = LocalStack(config.log_dir)
            cleanup.callback(stack.stop)
            addresses = await local.launch(config, stack, security=config)
            watcher = asyncio.create_task(stack.watch())
            cleanup.callback(watcher.cancel)
        else:
            workers = {
                "prefill": config.prefill_workers,
                "decode": config.decode_workers,
                "both": config.pd_workers,
            }
            addresses = local.StackAddresses(
                config.tokenizer or "",
                {k: list(v) for k, v in workers.items()},
                "",
                config.kvstore_address,
                config.encoders,
            )
        parts = await assemble(
            cleanup,
            tokenizer_address=addresses.tokenizer,
            workers=addresses.workers,
            routing=config.routing,
            kvstore_address=addresses.kvstore,
            served_model=addresses.served_model,
            migration_limit=config.migration_limit,
            security=security,
            breaker=config.breaker(),
            admission=config.admission(),
            request_timeout_s=config.request_timeout_s,
            # The local stack's workers listen on IP literals: nothing to look up.
            worker_dns_refresh_s=0.0 if config.launches_stack else config.worker_dns_refresh_s,
            # The local stack's workers already serve; given ones may still be loading.
            wait_for_workers_s=0.0 if config.launches_stack else config.wait_for_workers_s,
            disagg=config.disagg(),
            shared_streams=config.worker_streams == "shared",
        )
        state = GatewayState(
            parts.served_model,
            parts.max_model_len,
            parts.pipeline,
            parts.pool,
            parts.tokenizer,
            prompt_tokens_details=config.enable_prompt_tokens_details,
            force_include_usage=config.enable_force_include_usage,
            return_tokens_as_token_ids=config.return_tokens_as_token_ids,
            default_max_tokens=parts.default_max_tokens,
            max_logprobs=parts.max_logprobs,
            vocab_size=parts.vocab_size,
            enable_auto_tool_choice=config.enable_auto_tool_choice,
            encoder=encoder_stub(addresses.encoders, security),
            # No encoder, a vision-language model: the workers' engines encode the images.
            worker_images=(
                ImageLimits(allow_http=config.allow_image_urls, http_timeout_s=config.image_fetch_timeout_s)
                if parts.takes_images and not addresses.encoders
                else None
            ),
        )
        app = create_app(state, edge)
        # Outermost: a request's deadline starts when it arrives (libs/gateway/deadline.py).
        app.add_middleware(RequestDeadline, timeout_s=config.request_timeout_s)
        server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
        print(
            f"cleave: serving {state.served_model} at http://{config.host}:{port}/v1"
            + (f" (API key required: {len(edge.api_keys)} configured)" if edge.api_keys else ""),
            file=sys.stderr,
            flush=True,
        )
        await server.serve(sockets=[listener])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        edge = config.http_edge()  # reads the API key file and environment
        security = load_security(config, os.environ)  # --grpc-*: TLS files, the token
    except ConfigError as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 2
    configure_logging(level=config.effective_log_level, json=config.log_json, service="gateway")
    # SIGTERM stops the gateway the way Ctrl-C does (KeyboardInterrupt), so the local stack's
    # children are stopped on the way out. Python's default SIGTERM action kills the process
    # on the spot, and uvicorn re-raises the SIGTERM it caught once it has shut down, which
    # orphaned every worker and its vLLM engine.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # asyncio, not uvloop: uvloop cut no CPU per token here (docs/benchmarks.md, "Cleave's
        # own CPU per generated token", 2026-12-02).
        asyncio.run(serve(config, edge, security))
    except (ModelNotFoundError, LaunchError, TimeoutError, RuntimeError) as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
