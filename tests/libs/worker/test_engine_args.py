from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from libs.config.errors import ConfigError
from libs.config.flags import parse
from libs.config.groups import CpuBinding, GrpcSecurityFlags
from libs.config.roles import Role
from libs.worker.config import Device, WorkerConfig
from libs.worker.engine_args import cpu_cores, draft_cpu_cores, engine_environment, engine_kwargs


def config(**overrides: object) -> WorkerConfig:
    base: dict[str, object] = {
        "role": Role.PREFILL,
        "model": "/models/m",
        "served_model_name": "m",
    }
    base.update(overrides)
    return WorkerConfig(**base)  # type: ignore[arg-type]


def test_prefill_and_decode_get_nixl_with_their_kv_roles_and_lease() -> None:
    prefill = engine_kwargs(config(role=Role.PREFILL, kv_lease_s=12))
    decode = engine_kwargs(config(role=Role.DECODE))
    assert prefill["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    assert prefill["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert prefill["kv_transfer_config"]["kv_buffer_device"] == "cpu"
    assert prefill["kv_transfer_config"]["kv_connector_module_path"] == "libs.worker.vllm_nixl_connector"
    assert prefill["kv_transfer_config"]["kv_connector_extra_config"] == {
        "kv_lease_duration": 12,
        "nixl_progress_delay_us": 1000,
    }
    assert decode["kv_transfer_config"]["kv_role"] == "kv_consumer"
    assert "kv_transfer_config" not in engine_kwargs(config(role=Role.BOTH))


def test_engine_takes_token_ids_and_reports_stats() -> None:
    kwargs = engine_kwargs(config(max_num_seqs=3, max_model_len=1024, max_seq_len_to_capture=512))
    # The tokenizer loads for vLLM's structured-output backends (grammars need the vocabulary).
    assert kwargs["skip_tokenizer_init"] is False
    assert kwargs["disable_log_stats"] is False
    assert (kwargs["max_num_seqs"], kwargs["max_model_len"]) == (3, 1024)
    assert kwargs["max_cudagraph_capture_size"] == 512
    assert kwargs["dtype"] == "bfloat16"


def test_only_cpu_workers_run_eager_so_cuda_keeps_its_graphs() -> None:
    assert engine_kwargs(config())["enforce_eager"] is True
    cuda = engine_kwargs(config(device=Device.CUDA, max_seq_len_to_capture=256))
    # Eager would leave max_cudagraph_capture_size without effect.
    assert cuda["enforce_eager"] is False
    assert cuda["max_cudagraph_capture_size"] == 256


def test_qaic_overrides_and_device_group_pass_through_additional_config() -> None:
    kwargs = engine_kwargs(
        config(device=Device.QAIC, device_group=(0, 1), override_qaic_config=(("aic_num_cores", "16"),))
    )
    assert kwargs["additional_config"] == {
        "override_qaic_config": {"aic_num_cores": "16"},
        "device_group": [0, 1],
    }
    assert "dtype" not in kwargs


def test_speculative_config_is_parsed_json() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 5}
    kwargs = engine_kwargs(config(role=Role.DECODE, speculative_config=json.dumps(spec)))
    assert kwargs["speculative_config"] == spec
    assert "additional_config" not in kwargs


def test_draft_model_form_reaches_vllm_translated_and_the_qaic_plugin_in_additional_config() -> None:
    spec = {
        "speculative_model": "/models/draft",
        "num_speculative_tokens": 3,
        "draft_override_qaic_config": {"device_group": [0], "num_cores": 6},
    }
    kwargs = engine_kwargs(config(role=Role.DECODE, speculative_config=json.dumps(spec)))
    assert kwargs["speculative_config"] == {
        "method": "draft_model",
        "model": "/models/draft",
        "num_speculative_tokens": 3,
    }
    assert kwargs["additional_config"] == {
        "draft_override_qaic_config": {"device_group": [0], "num_cores": 6}
    }


def test_environment_pins_cpu_threads_and_side_channel() -> None:
    env = engine_environment(config(device_group=(0, 2), kv_port=5601), usable_cores={0, 1, 2, 3})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,2"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["PYTHONHASHSEED"] == "0"
    cuda = engine_environment(config(device=Device.CUDA, device_group=(3,)), usable_cores={0, 1})
    assert cuda["CUDA_VISIBLE_DEVICES"] == "3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cuda


def test_a_cpu_worker_without_a_device_group_binds_its_threads_to_every_usable_core() -> None:
    # Not vLLM's automatic binding ("auto"), which leaves a core to its spinning EngineCore.
    env = engine_environment(config(role=Role.BOTH), usable_cores={5, 3, 4, 0})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,3,4,5"
    assert cpu_cores(config(), usable_cores={1, 0}) == (0, 1)
    assert cpu_cores(config(device_group=(1,)), usable_cores={1, 0}) == (1,)
    # An inherited VLLM_CPU_OMP_THREADS_BIND never decides: the flag does.
    assert (
        engine_environment(config(cpu_binding=CpuBinding.AUTO), {0, 1})["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    )
    nobind = engine_environment(config(cpu_binding=CpuBinding.NOBIND, device_group=(1,)), {0, 1})
    assert nobind["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    # A GPU worker without a group sees every GPU (vLLM's default).
    cuda = engine_environment(config(device=Device.CUDA), usable_cores={0, 1})
    assert "CUDA_VISIBLE_DEVICES" not in cuda
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cuda


def test_a_container_quota_below_its_cores_gives_that_many_unbound_threads() -> None:
    # A pod without a cpuset sees the node's 64 cores; its quota allows 2 CPUs.
    node = set(range(64))
    env = engine_environment(config(role=Role.BOTH), usable_cores=node, cpu_limit=2)
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("nobind", "2")
    # A quota that covers the cores, a device group or another binding: as before.
    whole = engine_environment(config(role=Role.BOTH), usable_cores={0, 1}, cpu_limit=2)
    assert whole["VLLM_CPU_OMP_THREADS_BIND"] == "0,1" and "OMP_NUM_THREADS" not in whole
    grouped = engine_environment(config(device_group=(3, 4)), usable_cores=node, cpu_limit=2)
    assert grouped["VLLM_CPU_OMP_THREADS_BIND"] == "3,4"
    auto = engine_environment(config(cpu_binding=CpuBinding.AUTO), usable_cores=node, cpu_limit=2)
    assert auto["VLLM_CPU_OMP_THREADS_BIND"] == "auto"


def test_kv_cache_bytes_sizes_the_engine_cache_with_a_cpu_default() -> None:
    assert engine_kwargs(config(kv_cache_bytes=3 << 29))["kv_cache_memory_bytes"] == 3 << 29
    assert engine_kwargs(config())["kv_cache_memory_bytes"] == 1 << 30
    # On GPUs vLLM sizes the cache from its memory share unless told.
    assert "kv_cache_memory_bytes" not in engine_kwargs(config(device=Device.CUDA))


def test_invalid_configs_fail_with_the_flag_name() -> None:
    with pytest.raises(ConfigError, match="--kv-lease-s: got 2"):
        config(kv_lease_s=2)
    with pytest.raises(ConfigError, match=r"--speculative-config.*unset on a prefill worker"):
        config(role=Role.PREFILL, speculative_config='{"method": "ngram", "num_speculative_tokens": 5}')
    # A draft model is the exception: prefill computes the draft's prompt KV for the handoff.
    draft = '{"speculative_model": "/models/draft", "num_speculative_tokens": 3}'
    assert config(role=Role.PREFILL, speculative_config=draft).speculative is not None
    # Checked when the config is made (the worker's start-up), not when vLLM starts.
    with pytest.raises(ConfigError, match=r"--speculative-config key 'num_cores'"):
        config(
            role=Role.DECODE,
            speculative_config='{"method": "ngram", "num_speculative_tokens": 5, "num_cores": 6}',
        )


def test_a_kvstore_joins_nixl_through_multiconnector() -> None:
    kwargs = engine_kwargs(
        config(
            role=Role.PREFILL,
            kvstore_address="127.0.0.1:7000",
            kvstore_chunk_tokens=128,
            kvstore_timeout_s=0.5,
        )
    )
    transfer = kwargs["kv_transfer_config"]
    assert transfer["kv_connector"] == "MultiConnector" and transfer["kv_role"] == "kv_producer"
    assert transfer["kv_load_failure_policy"] == "recompute"
    nixl, kvstore = transfer["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector"
    assert kvstore["kv_connector_module_path"] == "libs.kvconnector.vllm_connector"
    assert kvstore["kv_connector_extra_config"] == {
        "kvstore_address": "127.0.0.1:7000",
        "kvstore_chunk_tokens": 128,
        "kvstore_timeout_s": 0.5,
        "kvstore_save": True,
        "kvstore_mxint8": False,
    }


def test_decode_workers_only_load_and_colocated_ones_use_the_kvstore_alone() -> None:
    decode = engine_kwargs(config(role=Role.DECODE, kvstore_address="h:1"))["kv_transfer_config"]
    assert (
        decode["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"]["kvstore_save"]
        is False
    )
    both = engine_kwargs(config(role=Role.BOTH, kvstore_address="h:1"))["kv_transfer_config"]
    assert both["kv_connector"] == "KvStoreConnector" and both["kv_connector_extra_config"]["kvstore_save"]


def test_mxint8_is_the_kvstore_format_and_the_engine_cache_stays_native() -> None:
    kwargs = engine_kwargs(config(role=Role.BOTH, kvstore_address="h:1", kv_cache_dtype="mxint8"))
    assert kwargs["kv_cache_dtype"] == "auto"
    assert kwargs["kv_transfer_config"]["kv_connector_extra_config"]["kvstore_mxint8"] is True
    # Without a kvstore, mxint8 off Cloud AI just keeps the native cache (never a stop).
    assert engine_kwargs(config(kv_cache_dtype="mxint8"))["kv_cache_dtype"] == "auto"


def test_on_qaic_mxint8_is_the_engine_cache_dtype_as_in_qaic_disagg() -> None:
    kwargs = engine_kwargs(config(role=Role.BOTH, device=Device.QAIC, kv_cache_dtype="mxint8"))
    assert kwargs["kv_cache_dtype"] == "mxint8"


def test_the_kvstore_connector_calls_with_the_workers_grpc_security_flags() -> None:
    paths = {
        "grpc_tls_cert_file": Path("/c.pem"),
        "grpc_tls_key_file": Path("/k.pem"),
        "grpc_tls_ca_file": Path("/ca.pem"),
        "grpc_token_file": Path("/token"),
    }
    kwargs = engine_kwargs(config(role=Role.BOTH, kvstore_address="h:1", **paths))
    extra = kwargs["kv_transfer_config"]["kv_connector_extra_config"]
    # Paths only (the connector reads the files in the engine's process), parsed back alike.
    assert parse(GrpcSecurityFlags, extra["kvstore_grpc_flags"]) == GrpcSecurityFlags(**paths)  # type: ignore[arg-type]
    plain = engine_kwargs(config(role=Role.BOTH, kvstore_address="h:1"))
    assert "kvstore_grpc_flags" not in plain["kv_transfer_config"]["kv_connector_extra_config"]


def test_structured_outputs_config_reaches_vllm_as_its_keywords() -> None:
    from libs.config.errors import ConfigError
    from libs.worker.engine_args import structured_outputs_config

    kwargs = engine_kwargs(config(structured_outputs_config='{"disable_any_whitespace": true}'))
    assert kwargs["structured_outputs_config"] == {"disable_any_whitespace": True}
    assert "structured_outputs_config" not in engine_kwargs(config())
    with pytest.raises(ConfigError, match="structured-outputs-config"):
        structured_outputs_config("[1]")


def test_max_logprobs_is_vllms_engine_argument_with_its_default_and_range() -> None:
    assert engine_kwargs(config())["max_logprobs"] == 20
    assert engine_kwargs(config(max_logprobs=-1))["max_logprobs"] == -1
    assert parse(WorkerConfig, ["--role", "decode", "--max-logprobs", "-1"]).max_logprobs == -1
    with pytest.raises(ConfigError, match="-1"):
        parse(WorkerConfig, ["--role", "decode", "--max-logprobs", "-2"])


def test_a_speculating_cpu_workers_threads_also_take_the_drafts_device_group() -> None:
    # vLLM runs the draft in the target's engine: the draft's cores can only join its threads.
    draft = json.dumps(
        {
            "speculative_model": "/models/d",
            "num_speculative_tokens": 3,
            "draft_override_qaic_config": {"device_group": [0, 3], "num_cores": 6},
        }
    )
    decode = config(role=Role.DECODE, device_group=(2, 3), speculative_config=draft)
    assert draft_cpu_cores(decode) == (0, 3)
    assert cpu_cores(decode, usable_cores={0, 1, 2, 3}) == (0, 2, 3)
    assert engine_environment(decode, usable_cores={0, 2, 3})["VLLM_CPU_OMP_THREADS_BIND"] == "0,2,3"
    # Without a device group the engine has every usable core, the draft's among them.
    assert cpu_cores(replace(decode, device_group=()), usable_cores={0, 1, 2, 3}) == (0, 1, 2, 3)
    # A prefill worker holds the draft only for its KV layers: the draft's cores are decode's.
    prefill = config(role=Role.PREFILL, device_group=(1,), speculative_config=draft)
    assert draft_cpu_cores(prefill) == ()
    assert cpu_cores(prefill, usable_cores={0, 1, 2, 3}) == (1,)
    # On Cloud AI the group is the plugin's (additional_config), never a CPU binding.
    qaic = replace(decode, device=Device.QAIC)
    assert draft_cpu_cores(qaic) == ()
    assert engine_kwargs(qaic)["additional_config"]["draft_override_qaic_config"]["device_group"] == [0, 3]
    # n-gram has no draft and no draft cores.
    ngram = config(
        role=Role.DECODE,
        device_group=(2,),
        speculative_config='{"method": "ngram", "num_speculative_tokens": 5}',
    )
    assert cpu_cores(ngram, usable_cores={0, 1, 2}) == (2,)


def test_a_speculating_cpu_engine_preloads_intel_openmp_before_what_it_inherited() -> None:
    ngram = '{"method": "ngram", "num_speculative_tokens": 5}'
    decode = config(role=Role.DECODE, speculative_config=ngram, openmp_library="/rf/intel_openmp/libiomp5.so")
    assert engine_environment(decode, {0, 1})["LD_PRELOAD"] == "/rf/intel_openmp/libiomp5.so"
    assert (
        engine_environment(decode, {0, 1}, "/x/libfoo.so")["LD_PRELOAD"]
        == "/rf/intel_openmp/libiomp5.so:/x/libfoo.so"
    )
    # Not resolved to a file ('none', or 'auto' before the entry point resolves it), no
    # speculation, or not a CPU: vLLM's default stands.
    assert "LD_PRELOAD" not in engine_environment(replace(decode, openmp_library="none"), {0, 1})
    assert "LD_PRELOAD" not in engine_environment(replace(decode, openmp_library="auto"), {0, 1})
    assert "LD_PRELOAD" not in engine_environment(replace(decode, speculative_config=None), {0, 1})
    assert "LD_PRELOAD" not in engine_environment(replace(decode, device=Device.CUDA), {0, 1})


def test_lora_flags_reach_vllm_only_when_enabled() -> None:
    assert "enable_lora" not in engine_kwargs(config())
    kwargs = engine_kwargs(config(enable_lora=True, max_loras=2, max_lora_rank=8))
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 2, 8)
    assert "max_cpu_loras" not in kwargs  # vLLM's default: max_loras
    assert engine_kwargs(config(enable_lora=True, max_cpu_loras=4))["max_cpu_loras"] == 4


def test_a_lora_rank_vllm_does_not_serve_is_refused_naming_the_flag() -> None:
    assert parse(WorkerConfig, ["--max-lora-rank", "64"]).max_lora_rank == 64
    with pytest.raises(ConfigError, match="--max-lora-rank"):
        parse(WorkerConfig, ["--max-lora-rank", "12"])
