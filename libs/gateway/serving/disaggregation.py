"""Conditional disaggregation: per request, remote prefill (prefill worker -> KV handoff ->
decode) or prefill on the decode worker itself (no handoff), as NVIDIA Dynamo's disaggregated
router and llm-d's selective P/D decide it.

Why: a remote prefill costs a request a second RPC, the prefill worker's queue and the NIXL
pull; a local prefill costs the decode worker's running streams the time its engine spends
on the prompt (vLLM mixes prompt chunks into their decode steps). Short uncached prompts are
cheaper to compute where they decode; long ones belong on the prefill worker, unless its
queue is long and the decode worker has room (Dynamo's rule: remote only when the prefill
length exceeds its local maximum and the prefill queue is below its maximum).

`decide` is a pure function of the request's facts and the thresholds (route.py asks it); the
serving room gathers the facts (kvstore lookup, the decode routing policy's prefix estimate, admission's in-flight
counts and the polled WorkerStats), counts and logs each decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from cleave.common.v1 import common_pb2
from libs.gateway.common import metrics
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing import PrefixCacheEstimate, RoutingPolicy

log = structlog.get_logger(__name__)

ALWAYS = "always"
CONDITIONAL = "conditional"
POLICIES = (ALWAYS, CONDITIONAL)

# Measured (tools/bench:disagg_threshold, docs/benchmarks.md "Conditional disaggregation",
# SmolLM2 on one CPU core per worker): up to 256 uncached tokens a local prefill stalled a
# running stream no longer than taking a handed-off prompt in did (218 vs 236 ms at 256) and
# saved the request ~0.5 s of TTFT; at 512 it stalled the stream ~100 ms longer.
DEFAULT_LOCAL_PREFILL_MAX_TOKENS = 256
# Not measured (set by reasoning: about one engine batch queued, half a batch decoding).
# A prefill worker with this many requests in flight or queued (the least loaded one) is
# backed up: a long prompt is computed on the decode worker instead...
DEFAULT_REMOTE_PREFILL_MAX_QUEUE = 4
# ...unless the decode worker already has this many other requests, whose inter-token latency
# a long local prefill would stall.
DEFAULT_LOCAL_PREFILL_MAX_DECODE_LOAD = 2

REMOTE = "remote"
LOCAL = "local"


@dataclass(frozen=True)
class DisaggConfig:
    policy: str = ALWAYS
    local_prefill_max_tokens: int = DEFAULT_LOCAL_PREFILL_MAX_TOKENS
    remote_prefill_max_queue: int = DEFAULT_REMOTE_PREFILL_MAX_QUEUE
    local_prefill_max_decode_load: int = DEFAULT_LOCAL_PREFILL_MAX_DECODE_LOAD

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown disaggregation policy {self.policy!r}; known: {', '.join(POLICIES)}")

    @property
    def conditional(self) -> bool:
        return self.policy == CONDITIONAL


@dataclass(frozen=True)
class DisaggInputs:
    prompt_tokens: int
    cached_tokens: int  # leading tokens the decode worker can reuse (kvstore, its prefix cache)
    # Requests in flight or queued on the least loaded serviceable prefill worker; None: none.
    prefill_queue: int | None
    decode_load: int  # other requests on the chosen decode worker
    prompt_logprobs: bool = False  # asked for: the prefill worker computes them

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


@dataclass(frozen=True)
class Decision:
    remote: bool
    reason: str

    @property
    def outcome(self) -> str:
        return REMOTE if self.remote else LOCAL


def decide(config: DisaggConfig, inputs: DisaggInputs) -> Decision:
    """Remote or local prefill for one request (rules in order; the first that applies wins)."""
    if not config.conditional:
        return Decision(True, "policy_always")
    if inputs.prefill_queue is None:
        return Decision(False, "no_prefill_worker")
    if inputs.prompt_logprobs:
        # The decode worker would compute them too, but over KV it may have loaded from the
        # kvstore, which vLLM cannot score; the prefill worker always computes the prompt.
        return Decision(True, "prompt_logprobs")
    if inputs.uncached_tokens <= config.local_prefill_max_tokens:
        return Decision(False, "short_prompt")
    if (
        inputs.prefill_queue >= config.remote_prefill_max_queue
        and inputs.decode_load < config.local_prefill_max_decode_load
    ):
        return Decision(False, "prefill_queue")
    return Decision(True, "long_prompt")


def prefill_queue(prefill_endpoints: Sequence[Endpoint]) -> int | None:
    """The least loaded prefill worker's requests: this gateway's in flight (fresher) or the
    worker's own polled running + waiting (other gateways' too), whichever is larger."""
    if not prefill_endpoints:
        return None
    return min(_load(e, own=0) for e in prefill_endpoints)


def decode_load(endpoint: Endpoint) -> int:
    """Other requests on the decode worker the request was admitted to (its slot is held)."""
    return _load(endpoint, own=1)


def _load(endpoint: Endpoint, *, own: int) -> int:
    polled = endpoint.stats.num_running + endpoint.stats.num_waiting
    return max(endpoint.admitted - own, polled)


class PrefixEstimate:
    """The decode routing policy's estimate of the prompt tokens each candidate caches, read
    before the policy's pick (prefix_affinity's memory of where prompts went, kv_events' view of
    the engines' own caches; other policies estimate 0)."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self._policy = policy if isinstance(policy, PrefixCacheEstimate) else None
        self.by_address: dict[str, int] = {}

    def observe(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> None:
        if self._policy is None:
            return
        self.by_address.update(self._policy.cached_tokens(candidates, prompt_token_ids, cache_salt, lora))

    def cached_tokens(self, address: str) -> int:
        return self.by_address.get(address, 0)


def record(decision: Decision, inputs: DisaggInputs, *, request_id: str, decode: str) -> None:
    """A decision `decide` made, counted by outcome and reason and logged with the request id."""
    metrics.DISAGG_DECISIONS.labels(decision.outcome, decision.reason).inc()
    log.info(
        "prefill placement",
        request_id=request_id,
        prefill=decision.outcome,
        reason=decision.reason,
        prompt_tokens=inputs.prompt_tokens,
        uncached_tokens=inputs.uncached_tokens,
        prefill_queue=inputs.prefill_queue,
        decode_load=inputs.decode_load,
        decode=decode,
    )
