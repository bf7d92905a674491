"""A vLLM stat logger that keeps what routing and tests need, in memory.

vLLM's own Prometheus logger exports the same counters, but only to a registry; the worker
needs them as numbers for GetStats (routing) and for tests that prove decode used
transferred KV (prompt tokens by source: computed / local cache hit / external transfer).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from libs.worker.engine import EngineStats

KVSTORE_CONNECTOR = "KvStoreConnector"  # libs.kvconnector.vllm_connector.CONNECTOR_NAME
NIXL_CONNECTOR = "NixlConnector"  # MultiConnector files stats under the class name


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
            self.stats.updates += 1
            self._add_kvstore(scheduler_stats.kv_connector_stats)
            self._add_kv_pulls(scheduler_stats.kv_connector_stats)
            self.stats.num_running = scheduler_stats.num_running_reqs
            self.stats.num_waiting = scheduler_stats.num_waiting_reqs
            self.stats.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            self._add_spec_decode(getattr(scheduler_stats, "spec_decoding_stats", None))
        if iteration_stats is not None:
            sources = iteration_stats.prompt_token_stats
            self.stats.prompt_tokens_computed += sources.computed
            self.stats.prompt_tokens_local_cache_hit += sources.local_cache_hit
            self.stats.prompt_tokens_external += sources.external_kv_transfer
            self.stats.requests_finished += len(iteration_stats.finished_requests)

    def _add_kvstore(self, connector_stats: dict[str, Any] | None) -> None:
        """The kvstore connector's counters (libs/kvconnector/counters.py): at the top level
        when it is the only connector, under its class name inside a MultiConnector."""
        if not connector_stats:
            return
        data = connector_stats.get(KVSTORE_CONNECTOR, connector_stats)
        if not isinstance(data, dict) or "lookups" not in data:
            return
        for name, value in data.items():
            if isinstance(value, int | float):
                self.stats.kvstore[name] = self.stats.kvstore.get(name, 0) + value

    def _add_kv_pulls(self, connector_stats: dict[str, Any] | None) -> None:
        """NIXL handoff reads, timed by NIXL's own telemetry (vLLM turns it on): lists of
        per-transfer values, at the top level or under "NixlConnector" in a MultiConnector."""
        if not connector_stats:
            return
        data = connector_stats.get(NIXL_CONNECTOR, connector_stats)
        if not isinstance(data, dict) or "transfer_duration" not in data:
            return
        pulls = self.stats.kv_pulls
        pulls["transfers"] = pulls.get("transfers", 0) + len(data["transfer_duration"])
        pulls["seconds"] = pulls.get("seconds", 0.0) + float(sum(data["transfer_duration"]))
        pulls["bytes"] = pulls.get("bytes", 0) + int(sum(data.get("bytes_transferred", ())))
        pulls["failures"] = pulls.get("failures", 0) + len(data.get("num_failed_transfers", ()))

    def _add_spec_decode(self, spec: Any) -> None:
        """vLLM's SpecDecodingStats: one step's drafts and accepted tokens (None on a step
        that verified no draft, or without speculative decoding)."""
        if spec is None:
            return
        counts = self.stats.spec_decode
        for name, value in (
            ("drafts", spec.num_drafts),
            ("draft_tokens", spec.num_draft_tokens),
            ("accepted_tokens", spec.num_accepted_tokens),
        ):
            counts[name] = counts.get(name, 0) + int(value)

    def log_engine_initialized(self) -> None:
        pass
