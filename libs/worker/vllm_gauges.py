"""vLLM's scheduler gauges for an engine that is not vLLM (the mock engine, libs/mockengine):
`vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`, with
vLLM's labels (`model_name`, `engine`), read from the engine's stats at each scrape.

A vLLM worker needs none of this: vLLM's own Prometheus stat logger runs in the worker's
process (vllm_engine.py adds it beside Cleave's stat logger, libs/worker/vllm_stats.py) and registers
every `vllm:*` metric in the registry the worker's --metrics-port serves. A mock worker exports
the gauges autoscalers and inference gateways read, so a fleet of them scales like real ones.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from libs.worker.engine import Engine

LABELS = ["model_name", "engine"]


class EngineGauges(Collector):
    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._labels = [model_name, "0"]  # one engine per worker, as vLLM's index 0

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        for name, text, value in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                stats.num_running,
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage),
        ):
            family = GaugeMetricFamily(name, text, labels=LABELS)
            family.add_metric(self._labels, float(value))
            yield family
