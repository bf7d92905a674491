"""vLLM's request-level metrics, exported by the gateway beside its own `cleave_gateway_*`
ones: vLLM's names, label names and default buckets (vLLM 0.32's vllm/v1/metrics/loggers.py
and buckets.py; tests/libs/gateway/common/test_vllm_metrics.py checks them against the locked
vLLM), so Grafana dashboards and autoscaling recipes written for `vllm serve` read a Cleave
gateway as they read vLLM's API server.

What the gateway measures is what a client sees: time to the first token it sends, the gaps
between the token events it streams, the whole request, and the time a request waited in the
gateway's admission queue (libs/gateway/fleet/admission.py) as vLLM's queue time. Labels:
`model_name` (the served model) and `engine="gateway"`, so a query can tell the gateway's
series from the workers' own (each worker's engine exports vLLM's metrics with its engine
index, libs/worker).
"""

from __future__ import annotations

import math

from prometheus_client import REGISTRY, Counter, Histogram

ENGINE = "gateway"
LABELS = ["model_name", "engine"]

# vllm/v1/metrics/buckets.py (0.32).
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
# vLLM's FinishReason names (vllm/v1/engine/__init__.py).
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def request_tokens_buckets(max_model_len: int) -> list[float]:
    """vLLM's 1-2-5 series capped at the model's context (buckets.build_1_2_5_buckets)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


TTFT = Histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    LABELS,
    buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
)
ITL = Histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    LABELS,
    buckets=INTER_TOKEN_LATENCY_BUCKETS,
)
TPOT = Histogram(
    "vllm:request_time_per_output_token_seconds",
    "Histogram of time_per_output_token_seconds per request.",
    LABELS,
    buckets=INTER_TOKEN_LATENCY_BUCKETS,
)
E2E = Histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "vllm:request_queue_time_seconds",
    "Histogram of time spent in WAITING phase for request.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
SUCCESS = Counter(
    "vllm:request_success", "Count of successfully processed requests.", [*LABELS, "finished_reason"]
)


class _TokenHistograms:
    """vLLM's per-request token counts, whose buckets follow the model's context length: made
    once the gateway knows it (`configure`)."""

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        buckets = request_tokens_buckets(max_model_len)
        self.prompt = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", LABELS, buckets=buckets
        )
        self.generation = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            LABELS,
            buckets=buckets,
        )
        self.max_tokens = Histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            LABELS,
            buckets=buckets,
        )

    def unregister(self) -> None:
        for histogram in (self.prompt, self.generation, self.max_tokens):
            REGISTRY.unregister(histogram)


_tokens: _TokenHistograms | None = None


def configure(max_model_len: int) -> None:
    """Creates the token-count histograms for the served model's context length (the
    composition root calls it once the workers said it)."""
    global _tokens
    if _tokens is not None:
        if _tokens.max_model_len == max_model_len:
            return
        _tokens.unregister()
    _tokens = _TokenHistograms(max_model_len)


def first_token(model: str, seconds: float) -> None:
    TTFT.labels(model, ENGINE).observe(seconds)


def inter_token(model: str, seconds: float) -> None:
    ITL.labels(model, ENGINE).observe(seconds)


def queued(model: str, seconds: float) -> None:
    QUEUE_TIME.labels(model, ENGINE).observe(seconds)


def finished(
    model: str,
    *,
    e2e_s: float,
    ttft_s: float | None,
    prompt_tokens: int,
    generation_tokens: int,
    max_tokens: int,
    finished_reason: str | None,
) -> None:
    """A request that ended with its completion (vLLM observes these as a request finishes)."""
    E2E.labels(model, ENGINE).observe(e2e_s)
    if ttft_s is not None and generation_tokens > 1:
        TPOT.labels(model, ENGINE).observe(max(e2e_s - ttft_s, 0.0) / (generation_tokens - 1))
    if finished_reason in FINISHED_REASONS:
        SUCCESS.labels(model, ENGINE, finished_reason).inc()
    if _tokens is not None:
        _tokens.prompt.labels(model, ENGINE).observe(prompt_tokens)
        _tokens.generation.labels(model, ENGINE).observe(generation_tokens)
        if max_tokens > 0 and not math.isinf(max_tokens):
            _tokens.max_tokens.labels(model, ENGINE).observe(max_tokens)
