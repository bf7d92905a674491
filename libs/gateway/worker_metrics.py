"""Worker counters re-exported on the gateway's /metrics, from the stats it polls anyway.

Workers export Prometheus only with --metrics-port (the local stack does not pass it), but
the pool polls every worker's GetStats each second; this collector turns the latest polled
values into gateway metrics, so one scrape of the gateway shows the handoff and kvstore
numbers of the whole pool. Values are cumulative since each worker started (a restarted
worker starts again from 0, as a counter would).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from libs.gateway.pool import WorkerPool


class WorkerStatsCollector(Collector):
    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        endpoints = self._pool.endpoints
        yield SummaryMetricFamily(
            "cleave_gateway_worker_kv_pull_seconds",
            "NIXL handoff reads by the decode workers, timed by NIXL's telemetry (all workers)",
            count_value=sum(e.stats.kv_pulls.transfers for e in endpoints),
            sum_value=sum(e.stats.kv_pulls.seconds for e in endpoints),
        )
        loaded = CounterMetricFamily(
            "cleave_gateway_worker_kvstore_tokens_loaded",
            "Prompt tokens each worker loaded from the kvstore instead of computing them",
            labels=["worker", "role"],
        )
        for e in endpoints:
            loaded.add_metric([e.address, e.role], e.stats.kvstore.tokens_loaded)
        yield loaded
