"""A mock worker's scrape shows vLLM's scheduler gauges, with vLLM's labels, at the values
its engine reports at that moment."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from libs.worker.engine import EngineStats
from libs.worker.vllm_gauges import EngineGauges


class Stats:
    """The one thing the collector asks of an engine."""

    def __init__(self) -> None:
        self.now = EngineStats()

    def stats(self) -> EngineStats:
        return self.now


def test_the_gauges_follow_the_engines_stats_at_each_scrape() -> None:
    engine = Stats()
    unused: Any = engine
    registry = CollectorRegistry()
    registry.register(EngineGauges(unused, "smol"))
    labels = {"model_name": "smol", "engine": "0"}
    engine.now = EngineStats(num_running=3, num_waiting=5, kv_cache_usage=0.25)
    assert registry.get_sample_value("vllm:num_requests_running", labels) == 3
    assert registry.get_sample_value("vllm:num_requests_waiting", labels) == 5
    assert registry.get_sample_value("vllm:kv_cache_usage_perc", labels) == 0.25
    engine.now = EngineStats()
    assert registry.get_sample_value("vllm:num_requests_waiting", labels) == 0
    assert 'vllm:num_requests_running{engine="0",model_name="smol"} 0.0' in generate_latest(registry).decode()
