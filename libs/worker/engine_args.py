"""WorkerConfig -> vLLM engine arguments and process environment (pure functions).

vLLM reads some settings only from environment variables (CPU KV space, thread binding,
the NIXL side channel). Libraries here never touch os.environ: the service's entry point
applies `engine_environment()` before it imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from libs.config.errors import ConfigError
from libs.config.flags import compose, render
from libs.config.groups import CpuBinding, GrpcSecurityFlags
from libs.config.roles import Role
from libs.worker.config import Device, WorkerConfig
from libs.worker.speculative import vllm_speculative_kwargs

CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30

_KV_ROLES = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}


def structured_outputs_config(text: str) -> dict[str, Any]:
    """--structured-outputs-config as vLLM's StructuredOutputsConfig keywords."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ConfigError("--structured-outputs-config", text, f"a JSON object ({error})") from None
    if not isinstance(document, dict):
        raise ConfigError(
            "--structured-outputs-config", text, 'a JSON object, e.g. {"disable_any_whitespace": true}'
        )
    return document


def engine_kwargs(config: WorkerConfig) -> dict[str, Any]:
    """Keyword arguments for vllm.engine.arg_utils.AsyncEngineArgs."""
    kwargs: dict[str, Any] = {
        "model": str(config.model_path),
        "served_model_name": config.served_model_name,
        # Cleave's tokenizer service owns text; engines see token ids only and never
        # detokenize (SamplingParams.detokenize=False). The engine still loads the tokenizer:
        # vLLM's structured-output backends compile grammars against its vocabulary, and
        # refuse every constrained request under skip_tokenizer_init.
        "skip_tokenizer_init": False,
        # None: vLLM takes the model's own context length.
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": config.enforce_eager,
        "kv_cache_dtype": config.engine_kv_cache_dtype,
        "generation_config": config.generation_config,
        # vLLM checks every request's logprobs against it; WorkerInfo tells the gateway.
        "max_logprobs": config.max_logprobs,
        "seed": config.seed,
        # Cleave's stats come from vLLM's stat loggers, which only run with stats on.
        "disable_log_stats": False,
        "enable_prefix_caching": True,
    }
    if config.enable_mm_embeds:
        kwargs["enable_mm_embeds"] = True
    if config.enable_lora:
        # Adapters come with each request (RequestMetadata.lora: name and path); vLLM loads
        # one on first use and keeps up to max_cpu_loras of them.
        kwargs.update(enable_lora=True, max_loras=config.max_loras, max_lora_rank=config.max_lora_rank)
        if config.max_cpu_loras is not None:
            kwargs["max_cpu_loras"] = config.max_cpu_loras
    if config.structured_outputs_config:
        kwargs["structured_outputs_config"] = structured_outputs_config(config.structured_outputs_config)
    if config.dtype != "auto":
        kwargs["dtype"] = config.dtype
    elif config.device is Device.CPU:
        kwargs["dtype"] = "bfloat16"
    # On CPU vLLM would otherwise size the cache from its own default; 1 GiB fits SmolLM2's
    # 8k context 45 times over and leaves room for several workers on one machine.
    kv_bytes = config.kv_cache_bytes or (CPU_DEFAULT_KV_CACHE_BYTES if config.device is Device.CPU else None)
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    if config.block_size is not None:
        kwargs["block_size"] = config.block_size
    if config.max_seq_len_to_capture is not None:
        kwargs["max_cudagraph_capture_size"] = config.max_seq_len_to_capture
    additional: dict[str, Any] = {}
    speculative = config.speculative
    if speculative is not None:
        kwargs["speculative_config"] = vllm_speculative_kwargs(speculative)
        if speculative.draft_override_qaic_config is not None:
            # The draft's Cloud AI settings (its device_group too): vLLM runs the draft in
            # this engine on the target's devices, so only the QAIC plugin can act on them.
            additional["draft_override_qaic_config"] = dict(speculative.draft_override_qaic_config)
    if config.override_qaic_config:
        additional["override_qaic_config"] = dict(config.override_qaic_config)
    if config.device is Device.QAIC and config.device_group:
        # Passed through for the QAIC platform plugin; Cleave does not interpret it there.
        additional["device_group"] = list(config.device_group)
    if additional:
        # vLLM hands additional_config to the platform plugin; only the QAIC plugin acts on
        # these keys, the CPU and CUDA platforms ignore them.
        kwargs["additional_config"] = additional
    connectors = []
    if config.role in _KV_ROLES:
        connectors.append(_nixl_connector(config))
    if config.kvstore_address is not None:
        connectors.append(_kvstore_connector(config))
    if len(connectors) == 1:
        kwargs["kv_transfer_config"] = connectors[0]
    elif connectors:
        kwargs["kv_transfer_config"] = {
            # vLLM's MultiConnector: NIXL loads handed-over prompts, the kvstore the rest;
            # both see every request's blocks.
            "kv_connector": "MultiConnector",
            "kv_role": _KV_ROLES[config.role],
            "kv_connector_extra_config": {"connectors": connectors},
            "kv_load_failure_policy": "recompute",
        }
    return kwargs


def _nixl_connector(config: WorkerConfig) -> dict[str, Any]:
    return {
        # vLLM's NixlConnector, subclassed only to set NIXL's progress-thread delay.
        "kv_connector": "NixlConnector",
        "kv_connector_module_path": "libs.worker.vllm_nixl_connector",
        "kv_role": _KV_ROLES[config.role],
        "kv_buffer_device": "cpu" if config.device is Device.CPU else "cuda",
        "kv_connector_extra_config": {
            "kv_lease_duration": config.kv_lease_s,
            "nixl_progress_delay_us": config.nixl_progress_delay_us,
        },
    }


def _kvstore_connector(config: WorkerConfig) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "kvstore_address": config.kvstore_address,
        "kvstore_chunk_tokens": config.kvstore_chunk_tokens,
        "kvstore_timeout_s": config.kvstore_timeout_s,
        "kvstore_save": config.role is not Role.DECODE,
        "kvstore_mxint8": config.kv_cache_dtype == "mxint8" and config.device is not Device.QAIC,
    }
    grpc_flags = render(compose(GrpcSecurityFlags, (config, GrpcSecurityFlags)))
    if grpc_flags:
        # The worker's --grpc-* flags, paths only: the connector reads the files in the engine's
        # process and calls the kvstore with the same TLS and token as the worker's server.
        extra["kvstore_grpc_flags"] = grpc_flags
    return {
        "kv_connector": "KvStoreConnector",
        "kv_connector_module_path": "libs.kvconnector.vllm_connector",
        "kv_role": "kv_both",
        # A chunk that cannot be loaded is computed instead of failing the request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def cpu_cores(config: WorkerConfig, usable_cores: Collection[int]) -> tuple[int, ...]:
    """The cores a CPU engine's OpenMP threads run on: its device group, else every core this
    process may use (`os.sched_getaffinity`, which the caller reads); on a speculating worker
    plus the draft model's `device_group`.

    This, not vLLM's automatic binding, is the default (`--cpu-binding cores`): vLLM's keeps
    one core per engine out of the OpenMP team for its EngineCore process, which on CPU mostly
    spin-waits for the model runner, so on 2 cores the model ran on one core while the spin
    took the other (docs/benchmarks.md, "All cores by default", 2026-12-01).
    """
    cores = config.device_group or tuple(sorted(usable_cores))
    return tuple(sorted({*cores, *draft_cpu_cores(config)}))


def draft_cpu_cores(config: WorkerConfig) -> tuple[int, ...]:
    """The draft model's `device_group` as CPU cores the engine adds to its own.

    vLLM runs a draft model inside the target's engine: same process, same OpenMP team, one
    step after the other (there is no per-draft placement on CPU). The cores given to the
    draft can therefore only work as more threads of that one team, which the draft's and the
    target's steps both use. Only a worker that speculates adds them: a prefill worker holds
    the draft too (for its KV layers, libs/stack/local.py), but the draft's cores belong to
    the decode stage, as in qaic_disagg's `--decode-speculative-config`.
    """
    spec = config.speculative
    if config.device is not Device.CPU or config.role is Role.PREFILL or spec is None:
        return ()
    return spec.draft_device_group


def engine_environment(
    config: WorkerConfig,
    usable_cores: Collection[int],
    inherited_preload: str = "",
    cpu_limit: int | None = None,
) -> dict[str, str]:
    """Environment variables vLLM must see before the engine starts; `usable_cores`: the cores
    this process may run on; `inherited_preload`: this process's LD_PRELOAD, kept after
    Cleave's; `cpu_limit`: the CPUs its container's quota allows (libs/config/cpus.py)."""
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": config.kv_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(config.kv_port),
        # Prefix-cache and KV-chunk hashes must agree across processes; a random hash seed
        # per process would make every cross-worker prefix lookup miss.
        "PYTHONHASHSEED": "0",
    }
    if config.verbose >= 2:
        env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    if (
        config.device is Device.CPU
        and config.speculative is not None
        and config.openmp_library not in ("auto", "none")
    ):
        # vLLM: "Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause
        # significant performance loss" (docs/benchmarks.md, "Speculative decoding"). vLLM
        # spawns its engine processes, so LD_PRELOAD set here reaches them; seeing libiomp it
        # adds no libgomp of its own and sets Intel OpenMP's affinity (KMP_AFFINITY).
        env["LD_PRELOAD"] = ":".join(p for p in (config.openmp_library, inherited_preload) if p)
    if config.device is Device.CPU:
        # Always set, so that a VLLM_CPU_OMP_THREADS_BIND this process inherited never decides.
        if quota_bound(config, usable_cores, cpu_limit):
            # A container whose quota allows fewer CPUs than the cores it sees (a pod without a
            # cpuset sees the node's): as many threads as the quota, on no core in particular
            # (bound to the first few, every such pod on a node would share the same ones).
            env["VLLM_CPU_OMP_THREADS_BIND"] = CpuBinding.NOBIND.value
            env["OMP_NUM_THREADS"] = str(cpu_limit)
        elif config.cpu_binding is CpuBinding.CORES:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(i) for i in cpu_cores(config, usable_cores))
        else:
            env["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_binding.value
    elif config.device is Device.CUDA and config.device_group:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config.device_group)
    return env


def quota_bound(config: WorkerConfig, usable_cores: Collection[int], cpu_limit: int | None) -> bool:
    """Whether a CPU engine's threads follow the container's CPU quota rather than its cores:
    no device group given, the default binding, and a quota below the cores it may use."""
    return (
        config.device is Device.CPU
        and not config.device_group
        and config.cpu_binding is CpuBinding.CORES
        and cpu_limit is not None
        and cpu_limit < len(usable_cores)
    )
