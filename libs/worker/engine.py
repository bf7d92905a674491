"""The engine seam: what the worker needs from an inference engine, engine-agnostic.

VllmEngine (vllm_engine.py) is the real one; tests of the worker's logic use a fake with the
same protocol. Outputs are deltas: each step carries only the new tokens of each sequence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from libs.kvlayout.layout import KvFacts
from libs.worker.kv_cache_feed import KvCacheFeed


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter a request is served with: the name clients use and its folder on this
    worker's file system (RequestMetadata.lora)."""

    name: str
    path: str


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float
    rank: int


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class SequenceDelta:
    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_token_id: int | None = None


@dataclass(frozen=True)
class EngineStep:
    sequences: tuple[SequenceDelta, ...]
    finished: bool
    num_prompt_tokens: int = 0
    # Prompt tokens whose KV was not computed by this request (prefix cache or transfer).
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    # One entry per prompt token (None for the first), only on the first step.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    # The prompt as the engine ran it, only on the first step of a prompt with images: its
    # image placeholders expanded to one token per embedding (a decode worker needs these ids).
    # The same whether the images came as embeddings or as pixels the engine encoded.
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SchedulerLimits:
    """What the engine's scheduler takes, named as vLLM's SchedulerConfig names it. Each engine
    fills it by name from its scheduler's own config (`of`), and the worker reports every field
    under the same name in WorkerInfo (reports.py): a limit the gateway needs is a field here,
    one in WorkerInfo and its use. 0: the engine does not say."""

    max_num_seqs: int = 0  # sequences one step runs at most
    max_num_batched_tokens: int = 0  # tokens one step schedules at most

    @classmethod
    def of(cls, scheduler_config: object) -> SchedulerLimits:
        found = {f.name: getattr(scheduler_config, f.name, None) for f in fields(cls)}
        return cls(**{name: int(value) for name, value in found.items() if value is not None})


@dataclass(frozen=True)
class EngineInfo:
    model: str
    vocab_size: int
    max_model_len: int
    kv: KvFacts  # what its KV cache is: the worker's KvLayout is made from it
    num_kv_blocks: int
    engine_id: str  # KV-transfer identity; empty when the engine transfers no KV
    engine_version: str
    # Sampling defaults for fields a request leaves unset: with `--generation-config auto`
    # the model's generation_config.json (vLLM's get_diff_sampling_param); empty with "vllm".
    sampling_defaults: Mapping[str, float] = field(default_factory=dict)
    # A vision-language model: generate() takes `images` (the engine runs the vision tower).
    takes_images: bool = False
    scheduler: SchedulerLimits = field(default_factory=SchedulerLimits)


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens_computed: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external: int = 0
    requests_finished: int = 0
    # How many scheduler snapshots these stats have taken in: a fact is reflected here only
    # when the count has moved since it happened (the engine reports after each step).
    updates: int = 0
    # Cumulative kvstore connector counters (lookups, tokens_loaded, ...); empty without one.
    kvstore: dict[str, float] = field(default_factory=dict)
    # Cumulative NIXL handoff reads (decode side): transfers, seconds, bytes, failures.
    kv_pulls: dict[str, float] = field(default_factory=dict)
    # Cumulative speculative decoding counts: drafts, draft_tokens, accepted_tokens.
    spec_decode: dict[str, int] = field(default_factory=dict)


class Engine(Protocol):
    # What the engine's prefix cache holds, from its KV events (Worker.WatchKvCache); None when
    # the engine publishes none.
    kv_cache_feed: KvCacheFeed | None

    @property
    def info(self) -> EngineInfo: ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        sequences: Sequence[tuple[int, Sequence[int]]] = (),
        lora: Adapter | None = None,
    ) -> AsyncIterator[EngineStep]:
        """`lora`: the adapter applied to the model (None: the base model); the prefix cache
        keeps each adapter's KV apart. `cache_salt` (non-empty) separates this prompt's prefix-cache entries from those of
        requests without the same salt (vLLM's cache_salt). `image_embeddings`: one
        [num_image_tokens, hidden_size] tensor per image placeholder of the prompt, in order
        (the encoder service's output). `images`: instead, one decoded PIL image per
        placeholder, which the engine preprocesses and encodes itself (no encoder service).
        `sequences`: a moved n > 1 request's open sequences, (index, tokens generated so
        far): one sequence each, from the prompt plus its tokens, with its budget less them."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def load_lora(self, adapter: Adapter) -> None:
        """Loads the adapter now, as a request naming it would (NotFound: no adapter there;
        InvalidRequest: the engine refuses it)."""
        ...

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        """Decode side: tell the prefill engine to free KV that will not be pulled."""
        ...

    def stats(self) -> EngineStats: ...

    @property
    def dead(self) -> bool:
        """The engine stopped working for good (its process died); only a restart helps."""
        ...

    async def shutdown(self) -> None: ...
