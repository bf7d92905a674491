"""The embedding cache: content hash -> image embeddings, least recently used out first,
bounded by bytes, so a repeated image is encoded once across requests.

(vLLM keeps an encoder cache inside each engine, keyed by its own multimodal hash; this one
is the encoder service's, shared by every prefill and colocated worker it feeds.)
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EmbeddingCache:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> torch.Tensor | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, embeddings: torch.Tensor) -> None:
        size = embeddings.numel() * embeddings.element_size()
        if size > self._max_bytes:
            return  # larger than the whole cache: keeping it would evict everything else
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.numel() * old.element_size()
        self._entries[key] = embeddings
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.numel() * evicted.element_size()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
