"""One sequence as the mock's scheduler sees it (vLLM's `Request`), and when it stops.

A client request with n > 1 becomes n sequences (vLLM's client fans out n child requests the
same way); they hash identically, so the prefix cache lets them share the prompt's full
blocks. Each keeps the token ids it has seen, how many of them have KV (num_computed_tokens),
its blocks and the hashes of its full blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from libs.kvevents.hashing import LoraIdentity
from libs.mockengine.blocks import KvBlock
from libs.mockengine.protocol import SamplingSpec


class Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    request_id: str
    index: int
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    sampling_key: int
    context_hash: int  # tokens.context_hash of all_token_ids
    cache_salt: str = ""
    lora: LoraIdentity | None = None
    kv_transfer_params: dict[str, Any] | None = None
    arrival: int = 0
    all_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    blocks: list[KvBlock] = field(default_factory=list)
    num_cached_blocks: int = 0
    status: Status = Status.WAITING
    num_preemptions: int = 0
    # Prompt tokens by source, set when first scheduled (vLLM's PrefillStats).
    prompt_stats_recorded: bool = False
    num_local_cached_tokens: int = 0
    num_external_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    # Decode side: the pull of a handed-over prompt succeeded and the KV "arrived".
    remote_kv_ready: bool = False
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def key(self) -> tuple[str, int]:
        return (self.request_id, self.index)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def wants_remote_prefill(self) -> bool:
        """Decode side: its prompt's KV is to be pulled from a prefill engine."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))

    @property
    def wants_remote_decode(self) -> bool:
        """Prefill side: its blocks are to be kept for a decode engine to pull."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"))

    @property
    def skips_prefix_cache(self) -> bool:
        """vLLM does not read the prefix cache for requests that want prompt logprobs."""
        return self.sampling.prompt_logprobs is not None

    def banned_tokens(self, eos_token_id: int) -> frozenset[int]:
        """Within min_tokens, vLLM masks EOS and the stop tokens."""
        if self.num_output_tokens >= self.sampling.min_tokens:
            return frozenset()
        return frozenset((eos_token_id, *self.sampling.stop_token_ids))


def check_stop(request: SimRequest, *, eos_token_id: int, max_model_len: int) -> bool:
    """vLLM's check_stop (vllm/v1/core/sched/utils.py), after a token was appended: sets the
    finish reason and returns whether the sequence is done."""
    sampling = request.sampling
    if request.num_output_tokens < sampling.min_tokens:
        return False
    last = request.output_token_ids[-1]
    if not sampling.ignore_eos and last == eos_token_id:
        request.finish_reason = "stop"
        return True
    if last in sampling.stop_token_ids:
        request.finish_reason = "stop"
        request.stop_reason = last
        return True
    if request.num_tokens >= max_model_len or request.num_output_tokens >= sampling.max_tokens:
        request.finish_reason = "length"
        return True
    return False
