"""What a worker starts a MockEngine with (the integration maps its flags onto these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libs.mockengine.config import NO_SIDE_CHANNEL, CoreConfig


@dataclass(frozen=True)
class MockEngineOptions:
    """None means the profile's value; see libs/mockengine/profiles/*.json."""

    profile: str = "zero"  # a name under libs/mockengine/profiles/ or a path to a .json file
    time_scale: float = 1.0  # multiplies every simulated duration (steps, KV transfers, start-up)
    served_model_name: str | None = None
    engine_id: str = "mock-engine"  # KV-transfer identity, unique per worker
    num_kv_blocks: int | None = None
    kv_cache_bytes: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    # Prefill role: the side channel decode engines pull from (the worker's --kv-host and
    # NIXL side-channel port); kv_port None serves none, 0 takes any free port.
    kv_host: str = "127.0.0.1"
    kv_port: int | None = None
    kv_lease_s: float = 30.0  # the worker's --kv-lease-s default
    pull_timeout_s: float = 10.0
    startup_s: float | None = None
    faults: str = ""  # libs/mockengine/faults.py
    cores: int | None = None  # the cores its real engine would use: picks the profile's coefficients
    vocab_size: int | None = None  # the served model's tokenizer, where it is not the profile's model's
    eos_token_id: int | None = None
    eos_probability: float = 0.0
    speculative_config: dict[str, Any] | None = None  # refused: not simulated

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            profile=self.profile,
            time_scale=self.time_scale,
            engine_id=self.engine_id,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_bytes=self.kv_cache_bytes,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            eos_probability=self.eos_probability,
            side_channel_host=self.kv_host,
            side_channel_port=NO_SIDE_CHANNEL if self.kv_port is None else self.kv_port,
            kv_lease_s=self.kv_lease_s,
            pull_timeout_s=self.pull_timeout_s,
            startup_s=self.startup_s,
            faults=self.faults,
            cores=self.cores,
            vocab_size=self.vocab_size,
            eos_token_id=self.eos_token_id,
        )
