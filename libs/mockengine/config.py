"""What an engine core is started with (the client passes it to the core process as JSON),
and what follows from it once the profile is read (sizes, limits)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from libs.mockengine.profiles import Profile, load_profile

NO_SIDE_CHANNEL = -1


class CoreConfig(msgspec.Struct, frozen=True, omit_defaults=True):  # type: ignore[call-arg]
    """None means "the profile's value". Durations in the profile are scaled by
    time_scale (steps, KV transfers, start-up); lease and pull timeouts are wall clock."""

    profile: str = "zero"
    time_scale: float = 1.0
    engine_id: str = "mock-engine"
    num_kv_blocks: int | None = None  # wins over kv_cache_bytes
    kv_cache_bytes: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    eos_probability: float = 0.0
    # KV handoff side channel this core serves pulls on (prefill role); NO_SIDE_CHANNEL: none,
    # 0: any free port (reported in Ready).
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = NO_SIDE_CHANNEL
    kv_lease_s: float = 30.0
    pull_timeout_s: float = 10.0
    startup_s: float | None = None
    faults: str = ""
    # The cores the engine it stands for would run on (a worker's --device-group): picks the
    # profile's coefficients measured on as many (Profile.coefficients_for).
    cores: int | None = None
    # The served model's tokenizer (its vocabulary and EOS), when it is not the profile's own
    # model: a profile's timing with the tokens another tokenizer can read (an accelerator
    # profile behind SmolLM2's tokenizer).
    vocab_size: int | None = None
    eos_token_id: int | None = None


@dataclass(frozen=True)
class ResolvedConfig:
    """A CoreConfig with every profile default filled in."""

    config: CoreConfig
    profile: Profile
    block_size: int
    num_kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    startup_s: float

    @property
    def kv_bytes_per_block(self) -> int:
        return self.profile.model.kv_bytes_per_block(self.block_size)


def resolve(config: CoreConfig) -> ResolvedConfig:
    profile = load_profile(config.profile)
    if config.vocab_size is not None or config.eos_token_id is not None:
        model = replace(
            profile.model,
            vocab_size=config.vocab_size or profile.model.vocab_size,
            eos_token_id=profile.model.eos_token_id if config.eos_token_id is None else config.eos_token_id,
        )
        profile = replace(profile, model=model)
    block_size = config.block_size or profile.model.block_size
    bytes_per_block = profile.model.kv_bytes_per_block(block_size)
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    else:
        num_blocks = (config.kv_cache_bytes or profile.kv_cache_bytes) // bytes_per_block
    max_model_len = config.max_model_len or profile.model.max_model_len
    if (num_blocks - 1) * block_size < max_model_len:
        # vLLM refuses to start when one request of max_model_len would not fit.
        raise ValueError(
            f"the mock's KV cache ({num_blocks} blocks of {block_size} tokens) cannot hold one"
            f" {max_model_len}-token sequence; give more blocks or a smaller max_model_len"
        )
    return ResolvedConfig(
        config=config,
        profile=profile,
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=config.max_num_seqs or profile.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens or profile.max_num_batched_tokens,
        max_model_len=max_model_len,
        startup_s=profile.startup_s if config.startup_s is None else config.startup_s,
    )
