"""A vLLM stat logger that keeps what routing and tests need, in memory.

vLLM's own Prometheus logger exports the same counters, but only to a registry; the worker
needs them as numbers for GetStats (routing) and for tests that prove decode used
transferred KV (prompt tokens by source: computed / local cache hit / external transfer).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from libs.worker.engine import EngineStats


class CapturingStatLogger(StatLoggerBase):
    """Created by vLLM through `factory()`; the worker reads `latest` from the instance."""

    latest: CapturingStatLogger | None = None

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.stats = EngineStats()
        type(self).latest = self

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.stats.num_running = scheduler_stats.num_running_reqs
            self.stats.num_waiting = scheduler_stats.num_waiting_reqs
            self.stats.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
        if iteration_stats is not None:
            sources = iteration_stats.prompt_token_stats
            self.stats.prompt_tokens_computed += sources.computed
            self.stats.prompt_tokens_local_cache_hit += sources.local_cache_hit
            self.stats.prompt_tokens_external += sources.external_kv_transfer
            self.stats.requests_finished += len(iteration_stats.finished_requests)

    def log_engine_initialized(self) -> None:
        pass
