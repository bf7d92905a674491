"""Prometheus metrics of a worker (process-wide, like every prometheus_client metric)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from libs.observability.metrics import RPC_BUCKETS_S, TTFT_BUCKETS_S
from libs.rpc.metrics import RpcMetrics

PREFILL_SECONDS = Histogram(
    "cleave_worker_prefill_seconds", "Prefill time: prompt KV and the first token", buckets=TTFT_BUCKETS_S
)
LOCAL_PREFILLS = Counter(
    "cleave_worker_local_prefills_total",
    "Decode-role requests that computed their prompt locally (no handoff)",
)
REQUESTS = Counter("cleave_worker_requests_total", "Worker RPCs by method and outcome", ["method", "outcome"])
RPC_SECONDS = Histogram(
    "cleave_worker_rpc_seconds", "Worker RPC duration by method", ["method"], buckets=RPC_BUCKETS_S
)
# What the servicer's methods record through libs/rpc (methods.py, metrics.py).
RPC = RpcMetrics(REQUESTS, RPC_SECONDS)
KV_CACHE_USAGE = Gauge("cleave_worker_kv_cache_usage", "Fraction of KV cache blocks in use")
PROMPT_TOKENS = Gauge(
    "cleave_worker_prompt_tokens",
    "Cumulative prompt tokens by source (computed, local_cache_hit, external)",
    ["source"],
)
LEASED_HANDOFFS = Gauge("cleave_worker_leased_handoffs", "Prefilled requests whose KV awaits a decode worker")
KVSTORE_CONNECTOR = Gauge(
    "cleave_worker_kvstore_connector",
    "Cumulative kvstore connector counters (lookups, tokens_loaded, lookup_failures, ...)",
    ["counter"],
)
KV_PULLS = Gauge(
    "cleave_worker_kv_pulls",
    "Cumulative NIXL handoff reads by this decode worker: transfers, seconds, bytes, failures",
    ["counter"],
)
SPEC_DECODE = Gauge(
    "cleave_worker_spec_decode",
    "Cumulative speculative decoding counts: drafts, draft_tokens, accepted_tokens",
    ["counter"],
)
SPEC_DECODE_ACCEPTANCE_RATE = Gauge(
    "cleave_worker_spec_decode_acceptance_rate", "Accepted / drafted speculative tokens since start, 0..1"
)
SPEC_DECODE_MEAN_ACCEPTED_LENGTH = Gauge(
    "cleave_worker_spec_decode_mean_accepted_length",
    "Tokens per verification step and sequence since start: 1 + accepted / drafts",
)
GENERATE_MANY_ITEMS = Histogram(
    "cleave_worker_generate_many_items",
    "Responses per GenerateMany message (several requests' tokens of one engine step travel together)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
DRAIN_REFUSED = Counter(
    "cleave_worker_drain_refused_total", "Requests refused because the worker was draining (shutting down)"
)
DRAIN_HANDED_OFF = Counter(
    "cleave_worker_drain_handed_off_total",
    "Running requests a draining worker ended for the gateway to move elsewhere (its grace ran out)",
)
INFLIGHT = Gauge(
    "cleave_worker_inflight_requests",
    "Requests running on this worker (prefills and generates), whichever gateways sent them",
)
INFLIGHT_LIMIT = Gauge(
    "cleave_worker_inflight_requests_limit",
    "The most requests this worker runs at once (--max-inflight-requests)",
)
REFUSED_AT_CAPACITY = Counter(
    "cleave_worker_refused_at_capacity_total",
    "Requests refused because the worker already ran its limit of them (the gateway waits and sends them again)",
)
