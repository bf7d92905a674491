"""The messages between the mock's client (in the worker's process) and its engine core (a
process of its own), msgpack-encoded with msgspec over ZMQ, as vLLM's engine-core client
talks to its EngineCore.

Client -> core: AddRequest, AbortRequests, ReleaseHandoff, GetStats, ResetPrefixCache,
Shutdown. Core -> client: Ready once (after the simulated start-up), then one
EngineCoreOutputs per engine step holding every sequence's new tokens of that step (and one
outside any step when aborts or lease expiries change something while idle), UtilityResult
answering GetStats / ResetPrefixCache, and CoreFailed just before a core dies of an error.

Field names follow vLLM's EngineCoreOutput (request_id, new_token_ids, finish_reason,
stop_reason, kv_transfer_params, num_cached_tokens) so that a worker shell moved onto vLLM's
engine-core client reads the mock the same way. One difference: vLLM's core sees each of a
request's n sequences as a request of its own (the client fans out); the mock's core takes
the parent request and reports each sequence by `index`.
"""

# msgspec's types are not on the lint's mypy path (third-party packages live in Bazel's @pypi),
# so Struct's class keywords (tag, omit_defaults, ...) look like arguments to object's
# __init_subclass__; this file only declares messages.
# mypy: disable-error-code="call-arg"

from __future__ import annotations

from typing import Any

import msgspec

from libs.mockengine.kv_events import KvEvent


class SamplingSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """What of vLLM's SamplingParams changes what the mock does."""

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = []
    logprobs: int | None = None
    prompt_logprobs: int | None = None


class LoraSpec(msgspec.Struct, frozen=True):
    name: str
    path: str
    int_id: int


# -- client -> core --------------------------------------------------------------------------
class AddRequest(msgspec.Struct, tag=True, omit_defaults=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    cache_salt: str = ""
    lora: LoraSpec | None = None
    # {"do_remote_decode": true} on a prefill engine; a NIXL descriptor on a decode engine.
    kv_transfer_params: dict[str, Any] | None = None


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]


class ReleaseHandoff(msgspec.Struct, tag=True):
    """Decode side: tell the prefill engine named in the descriptor to free its blocks."""

    request_id: str
    kv_transfer_params: dict[str, Any]


class GetStats(msgspec.Struct, tag=True):
    call_id: int


class ResetPrefixCache(msgspec.Struct, tag=True):
    call_id: int


class Shutdown(msgspec.Struct, tag=True):
    pass


CoreRequest = AddRequest | AbortRequests | ReleaseHandoff | GetStats | ResetPrefixCache | Shutdown


# -- core -> client --------------------------------------------------------------------------
class Logprobs(msgspec.Struct, array_like=True, gc=False):
    """One position: entry 0 is the token at that position (sampled or prompt), then the
    top alternatives; ranks are 1-based as vLLM's."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One sequence's news of one step."""

    request_id: str
    index: int = 0
    new_token_ids: list[int] = []
    new_logprobs: list[Logprobs] | None = None
    # Only with the sequence's first tokens: None for the first prompt token.
    new_prompt_logprobs: list[Logprobs | None] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | None = None  # the stop token id that ended it (not EOS)
    num_prompt_tokens: int = 0
    # Prompt tokens not computed by this request: local prefix-cache hits + transferred.
    num_cached_tokens: int = 0
    # A finished prefill's handoff descriptor (NIXL's shape).
    kv_transfer_params: dict[str, Any] | None = None
    # Why a request finished with "error" (a failed KV pull), for the adapter's exception.
    error: str | None = None


class CoreStats(msgspec.Struct, omit_defaults=True):
    """Scheduler state now plus counters since start (vLLM's SchedulerStats and
    IterationStats folded into what the worker reports)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens_computed: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external: int = 0
    requests_finished: int = 0
    num_preemptions: int = 0
    num_leases: int = 0
    kv_pull_transfers: int = 0
    kv_pull_seconds: float = 0.0
    kv_pull_bytes: int = 0
    kv_pull_failures: int = 0
    steps: int = 0
    simulated_busy_s: float = 0.0


class Ready(msgspec.Struct, tag=True):
    num_kv_blocks: int
    engine_id: str
    side_channel_host: str
    side_channel_port: int  # 0: this core serves no handoffs
    pid: int


class EngineCoreOutputs(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    step: int  # -1 for a message outside any step (aborts, expiries while idle)
    timestamp: float
    outputs: list[EngineCoreOutput] = []
    kv_events: list[KvEvent] = []
    stats: CoreStats = msgspec.field(default_factory=CoreStats)
    step_duration_s: float = 0.0  # simulated (scaled) duration of this step


class UtilityResult(msgspec.Struct, tag=True, omit_defaults=True):
    call_id: int
    stats: CoreStats | None = None
    ok: bool = True


class CoreFailed(msgspec.Struct, tag=True):
    message: str


CoreMessage = Ready | EngineCoreOutputs | UtilityResult | CoreFailed


def request_encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def request_decoder() -> msgspec.msgpack.Decoder[CoreRequest]:
    return msgspec.msgpack.Decoder(CoreRequest)


def message_decoder() -> msgspec.msgpack.Decoder[CoreMessage]:
    return msgspec.msgpack.Decoder(CoreMessage)
