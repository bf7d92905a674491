"""The gateway's vLLM-named metrics against the locked vLLM itself: the same names, label
names, bucket boundaries and finish reasons as vLLM 0.32's Prometheus stat logger
(vllm/v1/metrics/loggers.py, read as source: its logger needs a whole engine config), and the
values a request leaves in them."""

from __future__ import annotations

import ast
import inspect
import re

from prometheus_client import REGISTRY
from vllm.v1.engine import FinishReason
from vllm.v1.metrics import buckets, loggers

from libs.gateway.common import vllm_metrics


def vllm_metric_calls() -> dict[str, ast.Call]:
    """Each `name="vllm:..."` metric constructor call in vLLM's stat logger, by name."""
    calls: dict[str, ast.Call] = {}
    for node in ast.walk(ast.parse(inspect.getsource(loggers))):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    calls[str(keyword.value.value)] = node
    return calls


def keyword(call: ast.Call, name: str) -> str:
    return next(ast.unparse(k.value) for k in call.keywords if k.arg == name)


def test_names_labels_and_buckets_are_vllms() -> None:
    calls = vllm_metric_calls()
    histograms = {
        vllm_metrics.TTFT: "time_to_first_token_buckets",
        vllm_metrics.ITL: "inter_token_latency_buckets",
        vllm_metrics.TPOT: "inter_token_latency_buckets",
        vllm_metrics.E2E: "request_latency_buckets",
        vllm_metrics.QUEUE_TIME: "request_latency_buckets",
    }
    for histogram, vllm_buckets in histograms.items():
        name = histogram._name
        assert name in calls, f"vLLM has no metric {name}"
        assert keyword(calls[name], "labelnames") == "labelnames"  # ["model_name", "engine"]
        assert keyword(calls[name], "buckets") == vllm_buckets, name
    assert "labelnames = ['model_name', 'engine']" in ast.unparse(ast.parse(inspect.getsource(loggers)))
    assert keyword(calls["vllm:request_success"], "labelnames") == "labelnames + ['finished_reason']"
    for name in (
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens",
    ):
        assert keyword(calls[name], "buckets") == "request_tokens_buckets"
    assert vllm_metrics.TIME_TO_FIRST_TOKEN_BUCKETS == buckets.TIME_TO_FIRST_TOKEN_BUCKETS
    assert vllm_metrics.INTER_TOKEN_LATENCY_BUCKETS == buckets.INTER_TOKEN_LATENCY_BUCKETS
    assert vllm_metrics.REQUEST_LATENCY_BUCKETS == buckets.REQUEST_LATENCY_BUCKETS
    for max_model_len in (1, 100, 2048, 8192, 131072):
        assert vllm_metrics.request_tokens_buckets(max_model_len) == buckets.build_1_2_5_buckets(
            max_model_len
        )
    assert set(vllm_metrics.FINISHED_REASONS) == {str(reason) for reason in FinishReason}
    assert re.fullmatch(r"vllm:\w+", vllm_metrics.SUCCESS._name)


def test_a_finished_request_is_counted_under_its_model_and_the_gateway_engine() -> None:
    vllm_metrics.configure(2048)
    labels = {"model_name": "smol", "engine": "gateway"}

    def value(name: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = value("vllm:request_success_total", finished_reason="length")
    vllm_metrics.first_token("smol", 0.2)
    vllm_metrics.finished(
        "smol", e2e_s=1.2, ttft_s=0.2, prompt_tokens=30, generation_tokens=11, max_tokens=11,
        finished_reason="length",
    )  # fmt: skip
    assert value("vllm:request_success_total", finished_reason="length") == before + 1
    assert value("vllm:request_time_per_output_token_seconds_sum") >= 0.1  # (1.2 - 0.2) / 10
    assert value("vllm:request_prompt_tokens_bucket", le="50.0") >= 1
    assert value("vllm:request_prompt_tokens_bucket", le="20.0") == 0
    assert value("vllm:time_to_first_token_seconds_count") >= 1
    vllm_metrics.configure(4096)  # another model's context: the token histograms are remade
    assert REGISTRY.get_sample_value("vllm:request_prompt_tokens_bucket", {**labels, "le": "5000.0"}) is None
