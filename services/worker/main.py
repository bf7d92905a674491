"""Entry point of a Cleave engine worker: `--role prefill|decode|both`.

./bazel run //services/worker -- --role both --port 50051
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import prometheus_client
import structlog

from cleave.worker.v1 import worker_pb2_grpc
from libs.config.cpus import usable_cpus
from libs.config.errors import ConfigError
from libs.config.flags import parse
from libs.config.groups import EngineKind
from libs.config.roles import Role
from libs.models.errors import ModelNotFoundError
from libs.models.resolve import resolve_model
from libs.models.spec import fitted_context_length
from libs.observability.logging import configure_logging
from libs.observability.metrics import start_metrics_server
from libs.rpc.deferred import DeferredServicer
from libs.rpc.ports import free_port
from libs.rpc.security import RpcSecurity, load_security
from libs.rpc.server import Drain, GrpcServer, ServerConfig, ServiceBinding, serve_until_signal
from libs.worker.config import Device, WorkerConfig
from libs.worker.engine import Engine
from libs.worker.engine_args import cpu_cores, draft_cpu_cores, engine_environment, engine_kwargs
from libs.worker.service import WorkerService
from libs.worker.speculative import FLAG as SPEC_FLAG
from libs.worker.vllm_gauges import EngineGauges
from services.worker.servicer import SERVICE_NAME, WorkerServicer

log = structlog.get_logger("cleave.worker")

# The process's exit status when its engine died: non-zero, so a supervisor (the local stack,
# systemd, Kubernetes) restarts it; distinct, so its log is not the only place that says why.
EXIT_ENGINE_DIED = 3


def resolved(config: WorkerConfig) -> WorkerConfig:
    """`--model` and a speculative draft model as folders, the served name filled in, a NIXL
    side-channel port chosen."""
    model = resolve_model(
        config.model, config.model_cache_dir, progress=True, allow_download=config.allow_model_download
    )
    # NIXL's side channel is bound by vLLM itself, after the model loads, on a port it must
    # be told in advance: the one port Cleave cannot bind first (see libs/rpc/ports.py).
    kv_port = config.kv_port or (free_port() if config.transfers_kv else 0)
    speculative = config.speculative
    if speculative is not None and speculative.draft_model is not None:
        draft = resolve_model(
            speculative.draft_model,
            config.model_cache_dir,
            progress=True,
            allow_download=config.allow_model_download,
        )
        speculative = speculative.with_draft_model(str(draft.path))
    return replace(
        config,
        openmp_library=shipped_openmp_library(config),
        model=str(model.path),
        served_model_name=config.served_model_name or model.served_name,
        max_model_len=fitted_max_model_len(config.max_model_len, model.path),
        kv_port=kv_port,
        speculative_config=speculative.to_json() if speculative is not None else None,
    )


def mock_resolved(config: WorkerConfig) -> WorkerConfig:
    """The mock engine loads no model: `--model` only names what is served (the profile holds
    the model's facts), and a prefill worker's side channel gets a port as NIXL's would."""
    kv_port = config.kv_port or (free_port() if config.role is Role.PREFILL else 0)
    return replace(
        config, served_model_name=config.served_model_name or Path(config.model).name, kv_port=kv_port
    )


def shipped_openmp_library(config: WorkerConfig) -> str:
    """`--openmp-library auto` as a path: the libiomp5.so of the locked intel-openmp wheel,
    which Bazel puts in this binary's runfiles (@intel_openmp, see WORKSPACE); 'none' when the
    worker does not speculate on CPU or the file is missing (an install without it)."""
    if config.openmp_library != "auto":
        return config.openmp_library
    if config.device is not Device.CPU or config.speculative is None:
        return "none"
    runfiles = Path(__file__).parents[3]  # <runfiles>/cleave/services/worker/main.py
    for candidate in (runfiles / "intel_openmp", runfiles / "cleave" / "external" / "intel_openmp"):
        if (candidate / "libiomp5.so").is_file():
            return str(candidate / "libiomp5.so")
    log.warning(
        "speculative decoding without Intel OpenMP: libiomp5.so is not in this install "
        "(vLLM says CPU speculation is then much slower); give it with --openmp-library"
    )
    return "none"


def fitted_max_model_len(asked: int | None, model_path: Path) -> int | None:
    """`--max-model-len` capped at the model's own context length, with a warning (None:
    vLLM takes the model's own)."""
    fitted = fitted_context_length(asked, model_path)
    if asked is not None and fitted != asked:
        log.warning(
            "--max-model-len exceeds the model's context length; using the model's", asked=asked, used=fitted
        )
        return fitted
    return asked


def pin_to_cores(config: WorkerConfig) -> None:
    """Pins this process, and so vLLM's engine processes it starts, to the engine's cores: the
    device group, plus a speculating worker's draft `device_group` (engine_args.cpu_cores).

    vLLM binds only its OpenMP compute threads to the device group; its engine-core process
    (which spins in sched_yield while it waits for the model runner), the runner's other
    threads and this process's gRPC loop would float over every core and steal time from
    other workers' compute. Pinning the whole tree cut a local 1p1d stack's prefill stage for
    a short prompt from ~795 to ~648 ms and made TTFT steady (docs/benchmarks.md).
    """
    usable = os.sched_getaffinity(0)
    draft = draft_cpu_cores(config)
    for name, group in (
        ("--device-group", config.device_group),
        (f"{SPEC_FLAG} key 'draft_override_qaic_config.device_group'", draft),
    ):
        missing = sorted(set(group) - usable)
        if missing:
            raise ConfigError(
                name, ",".join(map(str, group)), f"cores of this machine; {missing} are not usable here"
            )
    cores = cpu_cores(config, usable)
    if draft:
        log.info(
            "the draft model runs inside this decode engine (vLLM has no separate draft placement "
            "on CPU): its device_group joins the engine's OpenMP threads, which run the draft's "
            "and the target's steps",
            draft_device_group=list(draft),
            device_group=list(config.device_group) or "all usable cores",
            engine_cores=list(cores),
        )
    if config.device_group:
        os.sched_setaffinity(0, cores)


# A dead engine serves nothing: calls still open (the gateway's GenerateMany stream stays open
# for the worker's life) can only fail, so they get a moment to see UNAVAILABLE, not the
# drain's grace (with it, a worker whose engine died took 25 s to exit, and its restart waited).
ENGINE_DEATH_GRACE_S = 1.0


async def serve(
    server: GrpcServer,
    load: Callable[[], Awaitable[None]],
    engine_dead: Callable[[], Awaitable[None]],
    drain: Drain | None = None,
) -> int:
    """Serves until SIGINT/SIGTERM (returns 0; `drain` finishes or hands off the running
    requests first, within --shutdown-grace-s: libs/worker/drain.py) or until the engine, once
    loaded, dies: then the server stops (health NOT_SERVING first, in-flight calls, which fail
    with UNAVAILABLE, get ENGINE_DEATH_GRACE_S) and this returns EXIT_ENGINE_DIED. A worker whose
    engine is gone would otherwise answer health checks and stats forever and serve nothing."""
    loaded = asyncio.Event()

    async def load_and_say_so() -> None:
        await load()
        loaded.set()

    async def death() -> None:
        await loaded.wait()
        await engine_dead()

    serving = asyncio.create_task(serve_until_signal(server, load=load_and_say_so, drain=drain))
    dying = asyncio.create_task(death())
    await asyncio.wait({serving, dying}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        dying.cancel()
        if serving.exception() is not None:
            await server.stop()  # a failed load: release the port, then raise
        serving.result()
        return 0
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    await server.stop(grace_s=ENGINE_DEATH_GRACE_S)
    log.error("stopped: the engine died", exit_code=EXIT_ENGINE_DIED)
    return EXIT_ENGINE_DIED


def import_vllm(config: WorkerConfig) -> None:
    """Sets vLLM's environment and imports it, before the gRPC port opens. The import holds the
    interpreter for seconds (torch and vLLM's modules: 11 s measured on a busy 2-core CI
    machine); on an open port that would hold every call silent as long, and a gateway's
    request behind it would wait instead of failing over. On a closed port it is refused at
    once."""
    # vLLM reads these from the environment; set them before it is imported. With no device
    # group, the engine's threads take every core this process may use.
    environment = engine_environment(
        config, os.sched_getaffinity(0), os.environ.get("LD_PRELOAD", ""), cpu_limit=usable_cpus()
    )
    if "LD_PRELOAD" in environment:
        log.info(
            "speculative decoding on CPU: the engine preloads Intel OpenMP", library=config.openmp_library
        )
    os.environ.update(environment)
    started = time.perf_counter()
    import libs.worker.vllm_engine  # noqa: F401  (the import is the point)

    log.info("vllm imported", seconds=round(time.perf_counter() - started, 1))


async def start_engine(config: WorkerConfig, address: str) -> Engine:
    """The worker's engine: vLLM on the model, or (--engine mock) the simulator, which never
    imports vLLM or torch."""
    if config.engine is EngineKind.MOCK:
        from libs.worker.mock import start_mock_engine

        engine = await start_mock_engine(config, address)
        # vLLM's own gauges come from vLLM's stat logger; the mock's from its stats.
        prometheus_client.REGISTRY.register(EngineGauges(engine, engine.info.model))
        return engine
    from libs.worker.vllm_engine import VllmEngine  # imported by import_vllm, before the port opened

    # vLLM's engine start blocks for the model load (tens of seconds). Off the event loop the
    # gRPC server answers meanwhile: health NOT_SERVING, calls UNAVAILABLE ("still loading"),
    # at once, so a gateway fails over instead of waiting on a silent worker (the compose kill
    # check). vLLM starts its output handler lazily when built outside a running loop.
    return await asyncio.to_thread(VllmEngine.start, engine_kwargs(config))


async def run(config: WorkerConfig, security: RpcSecurity) -> int:

    deferred = DeferredServicer(WorkerServicer)
    server = GrpcServer(
        ServerConfig.of(config, security),
        [ServiceBinding(SERVICE_NAME, deferred, worker_pb2_grpc.add_WorkerServicer_to_server)],
    )
    engines: list[Engine] = []
    services: list[WorkerService] = []

    async def load() -> None:
        started = time.perf_counter()
        log.info(
            "starting engine",
            engine=config.engine.value,
            role=config.role.value,
            model=str(config.model_path),
            address=server.address,
        )
        engine = await start_engine(config, server.address)
        engines.append(engine)
        log.info(
            "engine ready",
            seconds=round(time.perf_counter() - started, 1),
            kv_blocks=engine.info.num_kv_blocks,
        )
        services.append(WorkerService(config, engine, address=server.address))
        deferred.become(WorkerServicer(services[0]))

    try:
        return await serve(
            server, load, lambda: services[0].wait_engine_dead(), lambda deadline: services[0].drain(deadline)
        )
    finally:
        for engine in engines:
            await engine.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse(WorkerConfig, argv)
        configure_logging(
            level=config.effective_log_level, json=config.log_json, service=f"worker-{config.role.value}"
        )
        security = load_security(config, os.environ)  # --grpc-*: TLS files, the token
        if config.engine is EngineKind.MOCK:
            config = mock_resolved(config)
        else:
            config = resolved(config)
            if config.device is Device.CPU:
                pin_to_cores(config)  # fails here, with the flag's name, on a bad group
    except (ConfigError, ModelNotFoundError) as error:
        print(f"cleave worker: {error}", file=sys.stderr)
        return 2
    if config.kv_cache_dtype != config.engine_kv_cache_dtype:
        log.info(
            "kv-cache-dtype mxint8: this platform has no MXINT8 KV cache, so the engine's cache "
            "stays in the model dtype; KV leaving the engine for the kvstore is MXINT8",
            engine_cache_dtype=config.engine_kv_cache_dtype,
        )
    if config.metrics_port is not None:
        start_metrics_server(config.metrics_port, host=config.metrics_host)
    if config.engine is not EngineKind.MOCK:
        import_vllm(config)
    code = asyncio.run(run(config, security))
    # The interpreter's exit would spend 3-4 s in a last cyclic garbage collection of vLLM's
    # and torch's objects (py-spy: gc_collect_main), after everything has stopped; frozen
    # objects are not examined. The atexit handlers still run.
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
