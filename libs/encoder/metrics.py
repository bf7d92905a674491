"""Prometheus metrics of the encoder service (process-wide, like every prometheus_client metric)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from libs.observability.metrics import TTFT_BUCKETS_S

ENCODE_SECONDS = Histogram(
    "cleave_encoder_encode_seconds",
    "Vision tower + projector time per image (cache misses)",
    buckets=TTFT_BUCKETS_S,
)
QUEUE_SECONDS = Histogram(
    "cleave_encoder_queue_seconds", "Time an image waited for the vision tower", buckets=TTFT_BUCKETS_S
)
IMAGES = Counter(
    "cleave_encoder_images_total", "Images by outcome (encoded, cache_hit, refused)", ["outcome"]
)
CACHE_BYTES = Gauge("cleave_encoder_cache_bytes", "Bytes of embeddings held by the encoder cache")
CACHE_ENTRIES = Gauge("cleave_encoder_cache_entries", "Images whose embeddings the encoder cache holds")
