"""The encoder's logic, no network: image URLs -> (content hash, embeddings), with the cache
and limits. The vision tower runs on one worker thread at a time (it uses every core it is
given; two at once would only contend), so the event loop keeps serving while it runs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

import structlog
import torch
from PIL import Image

from libs.encoder import metrics
from libs.encoder.cache import EmbeddingCache
from libs.encoder.errors import ImageError
from libs.encoder.images import ImageLimits, content_hash, image_bytes, open_image

log = structlog.get_logger(__name__)


class Tower(Protocol):
    hidden_size: int

    def encode(self, image: Image.Image) -> torch.Tensor: ...


@dataclass(frozen=True)
class Encoded:
    content_hash: str
    embeddings: torch.Tensor  # [num_image_tokens, hidden_size]
    cached: bool


class ImageEncoder:
    def __init__(self, tower: Tower, limits: ImageLimits, cache_bytes: int) -> None:
        self._tower = tower
        self._limits = limits
        self._cache = EmbeddingCache(cache_bytes)
        self._lock = asyncio.Lock()

    @property
    def hidden_size(self) -> int:
        return self._tower.hidden_size

    @property
    def cache(self) -> EmbeddingCache:
        return self._cache

    async def encode(self, *, url: str = "", data: bytes = b"") -> Encoded:
        """One image, from a URL (data: or, where enabled, http(s)) or its file's bytes."""
        try:
            if url:
                # A fetch blocks for up to its timeout: off the event loop.
                data = await asyncio.to_thread(image_bytes, url, self._limits)
            key = content_hash(data)
            cached = self._cache.get(key)
            if cached is not None:
                metrics.IMAGES.labels("cache_hit").inc()
                return Encoded(key, cached, cached=True)
            image = await asyncio.to_thread(open_image, data, self._limits)
        except ImageError:
            metrics.IMAGES.labels("refused").inc()
            raise
        queued = time.perf_counter()
        async with self._lock:
            started = time.perf_counter()
            metrics.QUEUE_SECONDS.observe(started - queued)
            # A concurrent request may have encoded the same image while this one waited.
            cached = self._cache.get(key)
            if cached is not None:
                metrics.IMAGES.labels("cache_hit").inc()
                return Encoded(key, cached, cached=True)
            embeddings = await asyncio.to_thread(self._tower.encode, image)
            metrics.ENCODE_SECONDS.observe(time.perf_counter() - started)
        self._cache.put(key, embeddings)
        metrics.IMAGES.labels("encoded").inc()
        metrics.CACHE_BYTES.set(self._cache.nbytes)
        metrics.CACHE_ENTRIES.set(len(self._cache))
        log.debug("image encoded", content_hash=key[:16], tokens=int(embeddings.shape[0]), size=image.size)
        return Encoded(key, embeddings, cached=False)
