"""The connector's counters, as vLLM's KVConnectorStats carries them from the engine core
process (where the connector runs) to the worker process (where Cleave exports them)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

COUNTERS = (
    "lookups",
    "lookup_failures",  # kvstore unreachable or refused: the prompt is computed instead
    "tokens_loaded",
    "bytes_loaded",
    "load_failures",  # chunks missing, corrupt or unreachable at load time: recomputed
    "chunks_saved",
    "bytes_saved",
    "save_failures",  # chunks not saved (kvstore unreachable, queue full)
)
SECONDS = (
    "lookup_seconds",
    "load_seconds",
    # Time the forward step waits to copy chunks out of the paged cache; sending them to the
    # kvstore happens on a background thread and is not on the request's path.
    "save_copy_seconds",
)


@dataclass
class KvStoreConnectorStats(KVConnectorStats):
    data: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(COUNTERS + SECONDS, 0))

    def reset(self) -> None:
        self.data = dict.fromkeys(COUNTERS + SECONDS, 0)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {
            name: round(value, 4) if isinstance(value, float) else value for name, value in self.data.items()
        }

    def is_empty(self) -> bool:
        return not any(self.data.values())


class CounterBox:
    """Thread-safe accumulation (the background saver counts too) and take-and-reset."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = KvStoreConnectorStats()

    def add(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                self._stats.data[name] += value

    def take(self) -> KvStoreConnectorStats | None:
        with self._lock:
            if self._stats.is_empty():
                return None
            taken, self._stats = self._stats, KvStoreConnectorStats()
            return taken


class KvStorePromMetrics(KVConnectorPromMetrics):
    """vLLM's Prometheus logger records connector stats through this (a MultiConnector
    refuses stats from a child connector without one). Exported as vllm:cleave_kvstore_*."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._per_engine: dict[str, dict[int, Any]] = {}
        for name in COUNTERS + SECONDS:
            counter = self._counter_cls(
                name=f"vllm:cleave_kvstore_{name}",
                documentation=f"Cleave kvstore connector: {name.replace('_', ' ')}",
                labelnames=labelnames,
            )
            self._per_engine[name] = create_metric_per_engine(counter, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            if name in self._per_engine and value:
                self._per_engine[name][engine_idx].inc(value)
