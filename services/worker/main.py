"""Entry point of a Cleave engine worker: `--role prefill|decode|both`.

./bazel run //services/worker -- --role both --port 50051
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import structlog

from cleave.worker.v1 import worker_pb2_grpc
from libs.config.errors import ConfigError
from libs.models.errors import ModelNotFoundError
from libs.models.resolve import resolve_model
from libs.observability.logging import configure_logging
from libs.observability.metrics import start_metrics_server
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding, serve_until_signal
from libs.worker.config import Device, WorkerConfig
from libs.worker.engine_args import engine_environment, engine_kwargs
from libs.worker.service import WorkerService
from services.worker.config import WorkerProcessConfig, parse_args
from services.worker.servicer import WorkerServicer

log = structlog.get_logger("cleave.worker")


def worker_config(process: WorkerProcessConfig) -> WorkerConfig:
    resolved = resolve_model(process.model, process.model_cache_dir, progress=True)
    return WorkerConfig(
        role=process.role,
        model_path=resolved.path,
        served_model_name=process.served_model_name or resolved.served_name,
        device=process.device,
        device_group=process.device_group,
        max_model_len=process.max_model_len,
        max_num_seqs=process.max_num_seqs,
        max_seq_len_to_capture=process.max_seq_len_to_capture,
        kv_cache_dtype=process.kv_cache_dtype,
        dtype=process.dtype,
        cpu_kv_cache_gib=process.cpu_kv_cache_gib,
        block_size=process.block_size,
        override_qaic_config=process.override_qaic_config,
        speculative_config=process.speculative_config,
        generation_config=process.generation_config,
        kv_host=process.kv_host,
        kv_port=process.kv_port,
        kv_lease_s=process.kv_lease_s,
        nixl_progress_delay_us=process.nixl_progress_delay_us,
        kvstore_address=process.kvstore_address,
        kvstore_chunk_tokens=process.kvstore_chunk_tokens,
    )


def pin_to_cores(cores: tuple[int, ...]) -> None:
    """Pins this process, and so vLLM's engine processes it starts, to `cores`.

    vLLM binds only its OpenMP compute threads to the device group; its engine-core process
    (which spins in sched_yield while it waits for the model runner), the runner's other
    threads and this process's gRPC loop would float over every core and steal time from
    other workers' compute. Pinning the whole tree cut a local 1p1d stack's prefill stage for
    a short prompt from ~795 to ~648 ms and made TTFT steady (docs/benchmarks.md).
    """
    usable = os.sched_getaffinity(0)
    missing = sorted(set(cores) - usable)
    if missing:
        raise ConfigError(
            "--device-group",
            ",".join(map(str, cores)),
            f"cores of this machine; {missing} are not usable here",
        )
    os.sched_setaffinity(0, cores)


async def run(process: WorkerProcessConfig, config: WorkerConfig) -> None:
    # vLLM reads these from the environment; set them before it is imported.
    os.environ.update(engine_environment(config))
    from libs.worker.vllm_engine import VllmEngine

    started = time.perf_counter()
    log.info("starting engine", role=config.role.value, model=str(config.model_path))
    engine = VllmEngine.start(engine_kwargs(config))
    log.info(
        "engine ready", seconds=round(time.perf_counter() - started, 1), kv_blocks=engine.info.num_kv_blocks
    )
    server_config = ServerConfig(host=process.host, port=process.port)
    service = WorkerService(config, engine, address="")
    binding = ServiceBinding(
        "cleave.worker.v1.Worker", WorkerServicer(service), worker_pb2_grpc.add_WorkerServicer_to_server
    )
    server = GrpcServer(server_config, [binding])
    try:
        await serve_until_signal(server, on_started=lambda: service.set_address(server.address))
    finally:
        await engine.shutdown()


def main() -> int:
    try:
        process = parse_args()
        configure_logging(
            level=process.log_level, json=process.log_json, service=f"worker-{process.role.value}"
        )
        config = worker_config(process)
        if config.device is Device.CPU and config.device_group:
            pin_to_cores(config.device_group)  # fails here, with the flag's name, on a bad group
    except (ConfigError, ModelNotFoundError) as error:
        print(f"cleave worker: {error}", file=sys.stderr)
        return 2
    if process.metrics_port is not None:
        start_metrics_server(process.metrics_port)
    asyncio.run(run(process, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
