"""Gateway Prometheus metrics: per-stage latency, TTFT, inter-token latency, outcomes."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from libs.observability.metrics import E2E_BUCKETS_S, ITL_BUCKETS_S, TOKEN_COUNT_BUCKETS, TTFT_BUCKETS_S

REQUESTS = Counter(
    "cleave_gateway_requests_total", "HTTP requests by endpoint and status", ["endpoint", "status"]
)
TTFT_SECONDS = Histogram("cleave_gateway_ttft_seconds", "Time to first token", buckets=TTFT_BUCKETS_S)
ITL_SECONDS = Histogram("cleave_gateway_itl_seconds", "Time between streamed tokens", buckets=ITL_BUCKETS_S)
E2E_SECONDS = Histogram(
    "cleave_gateway_e2e_seconds", "Request latency, first byte in to last byte out", buckets=E2E_BUCKETS_S
)
STAGE_SECONDS = Histogram(
    "cleave_gateway_stage_seconds", "Latency of each stage", ["stage"], buckets=TTFT_BUCKETS_S
)
PROMPT_TOKENS = Histogram("cleave_gateway_prompt_tokens", "Prompt length", buckets=TOKEN_COUNT_BUCKETS)
COMPLETION_TOKENS = Histogram(
    "cleave_gateway_completion_tokens", "Completion length", buckets=TOKEN_COUNT_BUCKETS
)
PREFILL_SKIPPED = Counter(
    "cleave_gateway_prefill_skipped_total",
    "Requests sent straight to decode because the kvstore held all but a short tail of the prompt",
)
DISAGG_DECISIONS = Counter(
    "cleave_gateway_disagg_decisions_total",
    "Prefill placement under --disagg-policy conditional: remote (prefill worker) or local "
    "(the decode worker), by the rule that decided (libs/gateway/serving/disaggregation.py)",
    ["outcome", "reason"],
)
RETRIES = Counter("cleave_gateway_retries_total", "Retries by stage", ["stage"])
MIGRATIONS = Counter(
    "cleave_gateway_migrations_total",
    "Requests continued on another worker after theirs failed mid-stream (libs/gateway/serving/migration.py)",
)
MIGRATIONS_REFUSED = Counter(
    "cleave_gateway_migrations_refused_total",
    "Mid-stream worker failures that ended the request instead of moving it, by reason",
    ["reason"],
)
REQUEST_PHASES = Counter(
    "cleave_gateway_request_phase_total",
    "Requests entering each phase of their life (libs/gateway/serving/lifecycle.py)",
    ["phase"],
)
ROUTES = Counter(
    "cleave_gateway_routes_total",
    "Requests by the route chosen for their prompt (libs/gateway/serving/route.py)",
    ["route"],
)
