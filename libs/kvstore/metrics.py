"""Per-tier counters, exported to Prometheus and reported by GetStats.

The counters live here (not only in Prometheus) because GetStats reports them too, and
Prometheus' public API cannot read a counter back. A registry is passed in so that several
stores (tests) do not collide in the process-wide default registry.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum

import prometheus_client
from prometheus_client import CollectorRegistry


class Tier(StrEnum):
    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"


@dataclass
class TierCounts:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class KvStoreMetrics:
    def __init__(self, registry: CollectorRegistry | None = prometheus_client.REGISTRY) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Tier, TierCounts] = defaultdict(TierCounts)
        self._rejected = 0

        def counter(name: str, doc: str, labels: list[str]) -> prometheus_client.Counter:
            return prometheus_client.Counter(name, doc, labels, registry=registry)

        self._hits = counter(
            "cleave_kvstore_hits_total", "Chunks served, by the tier that held them", ["tier"]
        )
        self._misses = counter("cleave_kvstore_misses_total", "Chunk reads a tier could not serve", ["tier"])
        self._bytes_in = counter(
            "cleave_kvstore_bytes_in_total", "Chunk bytes written into a tier (puts and promotions)", ["tier"]
        )
        self._bytes_out = counter(
            "cleave_kvstore_bytes_out_total", "Chunk bytes served from a tier", ["tier"]
        )
        self._evictions = counter(
            "cleave_kvstore_evictions_total", "Chunks evicted to keep a tier within its byte bound", ["tier"]
        )
        self._rejected_total = counter(
            "cleave_kvstore_rejected_chunks_total", "Chunks refused on put or dropped on read", ["reason"]
        )
        self._dropped = counter(
            "cleave_kvstore_dropped_entries_total",
            "Stored entries deleted because they could not be read or verified",
            ["tier", "reason"],
        )
        self._remote_errors = counter(
            "cleave_kvstore_remote_errors_total", "Redis operations that failed or timed out", ["op"]
        )
        self._lookup_tokens = counter(
            "cleave_kvstore_lookup_tokens_total",
            "Prompt tokens looked up, by whether they were stored",
            ["result"],
        )
        self.available = prometheus_client.Gauge(
            "cleave_kvstore_tier_available", "1 while a tier can be used", ["tier"], registry=registry
        )
        self.bytes_used = prometheus_client.Gauge(
            "cleave_kvstore_tier_bytes_used", "Bytes a tier holds", ["tier"], registry=registry
        )
        self.bytes_capacity = prometheus_client.Gauge(
            "cleave_kvstore_tier_bytes_capacity", "A tier's byte bound", ["tier"], registry=registry
        )

    def hit(self, tier: Tier, nbytes: int) -> None:
        with self._lock:
            counts = self._counts[tier]
            counts.hits += 1
            counts.bytes_out += nbytes
        self._hits.labels(tier.value).inc()
        self._bytes_out.labels(tier.value).inc(nbytes)

    def miss(self, tier: Tier) -> None:
        with self._lock:
            self._counts[tier].misses += 1
        self._misses.labels(tier.value).inc()

    def stored(self, tier: Tier, nbytes: int) -> None:
        with self._lock:
            self._counts[tier].bytes_in += nbytes
        self._bytes_in.labels(tier.value).inc(nbytes)

    def evicted(self, tier: Tier) -> None:
        with self._lock:
            self._counts[tier].evictions += 1
        self._evictions.labels(tier.value).inc()

    def rejected(self, reason: str) -> None:
        with self._lock:
            self._rejected += 1
        self._rejected_total.labels(reason).inc()

    def dropped(self, tier: Tier, reason: str) -> None:
        self._dropped.labels(tier.value, reason).inc()

    def remote_error(self, op: str) -> None:
        self._remote_errors.labels(op).inc()

    def looked_up(self, matched_tokens: int, total_tokens: int) -> None:
        self._lookup_tokens.labels("hit").inc(matched_tokens)
        self._lookup_tokens.labels("miss").inc(total_tokens - matched_tokens)

    def counts(self, tier: Tier) -> TierCounts:
        with self._lock:
            c = self._counts[tier]
            return TierCounts(c.hits, c.misses, c.evictions, c.bytes_in, c.bytes_out)

    @property
    def rejected_total(self) -> int:
        with self._lock:
            return self._rejected
