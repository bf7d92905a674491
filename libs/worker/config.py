"""A worker's configuration: parsed once at the process edge, passed everywhere else."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from libs.config.errors import ConfigError


class Role(enum.Enum):
    PREFILL = "prefill"  # computes prompts' KV and hands it over
    DECODE = "decode"  # loads handed-over KV and generates
    BOTH = "both"  # colocated: no transfer


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    QAIC = "qaic"


@dataclass(frozen=True)
class WorkerConfig:
    role: Role
    model_path: Path
    served_model_name: str
    device: Device = Device.CPU
    # CPU: cores the engine's compute threads are pinned to; CUDA: GPU ids; QAIC: passed to
    # the platform plugin. Empty = the platform's default.
    device_group: tuple[int, ...] = ()
    max_model_len: int = 2048
    max_num_seqs: int = 8
    # qaic_disagg's --*-max-seq-len-to-capture; vLLM 0.32 calls it max_cudagraph_capture_size.
    max_seq_len_to_capture: int | None = None
    kv_cache_dtype: str = "auto"
    # Weights/activations dtype; "auto" = bfloat16 on CPU (vLLM's CPU default), the model's own elsewhere.
    dtype: str = "auto"
    # CPU only: GiB of KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_gib: float = 1.0
    block_size: int | None = None
    enforce_eager: bool = True
    # qaic_disagg's --*-override-qaic-config "k:v k:v": handed to vLLM's additional_config;
    # only the QAIC platform plugin reads it, other platforms ignore it.
    override_qaic_config: tuple[tuple[str, str], ...] = ()
    # JSON, decode side only (e.g. {"method": "ngram", "num_speculative_tokens": 5}).
    speculative_config: str | None = None
    # "vllm" ignores the model's generation_config.json defaults, as qaic_disagg's flag does.
    generation_config: str = "vllm"
    seed: int = 0
    # KV handoff (NIXL) side channel this worker listens on (prefill) or uses (decode).
    kv_host: str = "127.0.0.1"
    kv_port: int = 5600
    # Seconds a prefill worker keeps KV for a decode worker that has not pulled it yet.
    kv_lease_s: int = 30
    # Microseconds NIXL's progress thread sleeps between polls; 0 = NIXL's busy-polling
    # default, which costs a full core per worker (see vllm_nixl_connector.py).
    nixl_progress_delay_us: int = 1000
    # host:port of the kvstore (fleet-wide prefix KV); None = no kvstore. Prefill and
    # colocated workers save the prompt chunks they compute, every role loads stored ones.
    kvstore_address: str | None = None
    # Must equal the kvstore's --chunk-tokens (it is part of every chunk key).
    kvstore_chunk_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_model_len <= 0:
            raise ConfigError("--max-model-len", self.max_model_len, "a positive integer")
        if self.max_num_seqs <= 0:
            raise ConfigError("--max-num-seqs", self.max_num_seqs, "a positive integer")
        if self.kv_lease_s < 6:
            # vLLM renews leases every lease/6 seconds (integer division).
            raise ConfigError("--kv-lease-s", self.kv_lease_s, "at least 6 seconds")
        if self.nixl_progress_delay_us < 0:
            raise ConfigError("--nixl-progress-delay-us", self.nixl_progress_delay_us, "0 or more")
        if self.kvstore_chunk_tokens <= 0:
            raise ConfigError("--kvstore-chunk-tokens", self.kvstore_chunk_tokens, "a positive integer")
        if (
            self.kv_cache_dtype == "mxint8"
            and self.device is not Device.QAIC
            and self.kvstore_address is None
        ):
            raise ConfigError(
                "--kv-cache-dtype",
                self.kv_cache_dtype,
                "a vLLM cache dtype; off QAIC, mxint8 is the kvstore's transfer and storage format "
                "and needs --kvstore-address",
            )
        if self.speculative_config and self.role is Role.PREFILL:
            raise ConfigError(
                "--speculative-config",
                self.speculative_config,
                "decode or both role (prefill emits one token)",
            )

    @property
    def engine_kv_cache_dtype(self) -> str:
        """What vLLM's cache holds. The QAIC plugin keeps KV in MXINT8 itself (qaic_disagg's
        `--kv-cache-dtype mxint8`); elsewhere MXINT8 is only how KV travels to and rests in
        the kvstore (no CPU or CUDA attention kernel reads it), so the cache stays native."""
        if self.kv_cache_dtype == "mxint8" and self.device is not Device.QAIC:
            return "auto"
        return self.kv_cache_dtype

    @property
    def transfers_kv(self) -> bool:
        return self.role is not Role.BOTH
