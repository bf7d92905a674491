from __future__ import annotations

import torch

from libs.encoder.cache import EmbeddingCache


def entry(value: float) -> torch.Tensor:
    return torch.full((4, 8), value)  # 128 bytes


def test_lru_eviction_by_bytes() -> None:
    cache = EmbeddingCache(max_bytes=3 * 128)
    for key in "abc":
        cache.put(key, entry(1.0))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", entry(2.0))
    assert cache.get("b") is None  # b was the least recently used
    assert {k for k in "acd" if cache.get(k) is not None} == {"a", "c", "d"}
    assert len(cache) == 3 and cache.nbytes == 3 * 128
    assert cache.hits == 4 and cache.misses == 1


def test_entry_larger_than_cache_is_not_kept() -> None:
    cache = EmbeddingCache(max_bytes=64)
    cache.put("a", entry(1.0))
    assert cache.get("a") is None and cache.nbytes == 0
