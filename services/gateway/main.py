"""Entry point of the Cleave gateway.

./bazel run //services/gateway                  # local 1p1d stack with SmolLM2, then serve
./bazel run //services/gateway -- --mode pd     # colocated
./bazel run //services/gateway -- --tokenizer H:P --prefill-workers H:P --decode-workers H:P
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace

import prometheus_client
import structlog
import uvicorn

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2
from libs.config.errors import ConfigError
from libs.gateway.kvstore_lookup import KvStoreLookup
from libs.gateway.pipeline import Pipeline
from libs.gateway.pool import WorkerPool
from libs.gateway.routing import create_policy
from libs.gateway.worker_metrics import WorkerStatsCollector
from libs.models.errors import ModelNotFoundError
from libs.models.resolve import resolve_model
from libs.observability.logging import configure_logging
from libs.rpc.channel import open_channel
from libs.stack.launcher import LocalStack, free_port
from services.gateway.app import GatewayState, create_app
from services.gateway.config import GatewayConfig, RoleOptions, parse_args

log = structlog.get_logger("cleave.gateway")


def worker_args(
    config: GatewayConfig,
    role: str,
    model_path: str,
    served: str,
    options: RoleOptions | None,
    kvstore_address: str | None = None,
) -> list[str]:
    args = [
        "--role",
        role,
        "--model",
        model_path,
        "--served-model-name",
        served,
        "--max-model-len",
        str(config.max_model_len),
    ]
    args += [
        "--kv-cache-dtype",
        config.kv_cache_dtype,
        "--dtype",
        config.dtype,
        "--generation-config",
        config.generation_config,
    ]
    args += ["--kv-port", str(free_port()), "--log-level", config.log_level]
    if options is not None:
        args += ["--max-num-seqs", str(options.max_num_seqs)]
        if options.device_group:
            args += ["--device-group", ",".join(map(str, options.device_group))]
        if options.max_seq_len_to_capture:
            args += ["--max-seq-len-to-capture", str(options.max_seq_len_to_capture)]
        if options.override_qaic_config:
            args += ["--override-qaic-config", " ".join(f"{k}:{v}" for k, v in options.override_qaic_config)]
    if role in ("decode", "both") and config.decode_speculative_config:
        args += ["--speculative-config", config.decode_speculative_config]
    if kvstore_address:
        args += ["--kvstore-address", kvstore_address]
    return args


def _start_kvstore(config: GatewayConfig, stack: LocalStack) -> str | None:
    """The kvstore the workers use: the one given, one started here, or none."""
    if not config.kvstore:
        return config.kvstore_address
    port = free_port()
    args = ["--port", str(port), "--cpu-bytes", config.kvstore_cpu_bytes, "--log-level", config.log_level]
    if config.kvstore_redis_url:
        args += ["--redis-url", config.kvstore_redis_url]
    return stack.start("kvstore", "kvstore", "services.kvstore.main", args, port).address


def split_cores(cores: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Default CPU device groups for a local disaggregated stack: prefill on the first half of
    the cores, decode on the rest, so the two never fight over a core (the point of
    disaggregating); vLLM's CPU threads otherwise spread over every core in each engine.
    NIXL still runs its own progress thread on the last core (see docs/architecture.md)."""
    if cores < 2:
        return (), ()
    half = cores // 2
    return tuple(range(half)), tuple(range(half, cores))


def _with_default_groups(config: GatewayConfig) -> GatewayConfig:
    if config.prefill.device_group or config.decode.device_group or config.mode.colocated:
        return config
    prefill_group, decode_group = split_cores(len(os.sched_getaffinity(0)))
    if not prefill_group:
        return config
    log.info("pinning local workers to cores", prefill=prefill_group, decode=decode_group)
    return replace(
        config,
        prefill=replace(config.prefill, device_group=prefill_group),
        decode=replace(config.decode, device_group=decode_group),
    )


def _port(options: RoleOptions, index: int) -> int:
    return options.port + index if options.port else free_port()


@dataclass(frozen=True)
class StackAddresses:
    tokenizer: str
    workers: dict[str, list[str]]
    served_model: str
    kvstore: str | None


async def launch_stack(config: GatewayConfig, stack: LocalStack) -> StackAddresses:
    resolved = resolve_model(config.model, config.cache_dir / "models", progress=True)
    served = config.served_model_name or resolved.served_name
    model_path = str(resolved.path)
    port = free_port()
    stack.start("tokenizer", "tokenizer", "services.tokenizer.main",
                ["--model", model_path, "--port", str(port), "--max-model-len", str(config.max_model_len)], port)  # fmt: skip
    kvstore_address = _start_kvstore(config, stack)
    topology = config.mode
    config = _with_default_groups(config)
    # (name prefix, role, how many, options): colocated workers take the decode options.
    launches = [
        ("pd", "both", topology.colocated, config.decode),
        ("prefill", "prefill", topology.prefill, config.prefill),
        ("decode", "decode", topology.decode, config.decode),
    ]
    for prefix, role, count, options in launches:
        for i in range(count):
            port = _port(options, i)
            args = [
                *worker_args(config, role, model_path, served, options, kvstore_address),
                "--port",
                str(port),
            ]
            stack.start(f"{prefix}-{i}", role, "services.worker.main", args, port)
    print(
        f"cleave: starting a local {topology.name} stack with {served} (logs in {stack.log_dir})",
        file=sys.stderr,
        flush=True,
    )
    await stack.wait_ready(config.startup_timeout_s)
    workers = {
        "prefill": stack.addresses("prefill"),
        "decode": stack.addresses("decode"),
        "both": stack.addresses("both"),
    }
    return StackAddresses(stack.addresses("tokenizer")[0], workers, served, kvstore_address)


async def serve(config: GatewayConfig) -> None:
    stack = LocalStack(config.cache_dir / "logs")
    async with AsyncExitStack() as cleanup:
        cleanup.callback(stack.stop)
        if config.launches_stack:
            addresses = await launch_stack(config, stack)
            watcher = asyncio.create_task(stack.watch())
            cleanup.callback(watcher.cancel)
        else:
            addresses = StackAddresses(
                tokenizer=config.tokenizer_address or "",
                workers={
                    "prefill": list(config.prefill_addresses),
                    "decode": list(config.decode_addresses),
                    "both": list(config.colocated_addresses),
                },
                served_model="",
                kvstore=config.kvstore_address,
            )
        tokenizer_address, workers, served = addresses.tokenizer, addresses.workers, addresses.served_model
        pool = WorkerPool(workers)
        cleanup.push_async_callback(pool.close)
        collector = WorkerStatsCollector(pool)
        prometheus_client.REGISTRY.register(collector)
        cleanup.callback(prometheus_client.REGISTRY.unregister, collector)
        await pool.start()
        first = next((e for e in pool.endpoints if e.healthy), None)
        if first is None:
            raise RuntimeError("no worker answered; check the worker addresses")
        info = await first.stub.GetInfo(worker_pb2.GetInfoRequest())
        tokenizer_channel = open_channel(tokenizer_address)
        cleanup.push_async_callback(tokenizer_channel.close)
        tokenizer = tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel)
        lookup = None
        if addresses.kvstore:
            # The workers' layout keys the kvstore's chunks; the gateway asks with the same one.
            lookup = KvStoreLookup(addresses.kvstore, info.kv_layout)
            cleanup.push_async_callback(lookup.close)
        policy = config.routing
        pipeline = Pipeline(
            pool, tokenizer, create_policy(policy), create_policy(policy), prefix_lookup=lookup
        )
        state = GatewayState(
            served_model=served or info.model,
            max_model_len=info.max_model_len,
            pipeline=pipeline,
            pool=pool,
            tokenizer=tokenizer,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(state), host=config.host, port=config.port, log_config=None, access_log=False
            )
        )
        print(
            f"cleave: serving {state.served_model} at http://{config.host}:{config.port}/v1",
            file=sys.stderr,
            flush=True,
        )
        await server.serve()


def main() -> int:
    try:
        config = parse_args()
    except ConfigError as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 2
    configure_logging(level=config.log_level, json=config.log_json, service="gateway")
    # SIGTERM stops the gateway the way Ctrl-C does (KeyboardInterrupt), so the local stack's
    # children are stopped on the way out. Python's default SIGTERM action kills the process
    # on the spot, and uvicorn re-raises the SIGTERM it caught once it has shut down, which
    # orphaned every worker and its vLLM engine (seen in the e2e runs).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(serve(config))
    except (ModelNotFoundError, TimeoutError, RuntimeError) as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
