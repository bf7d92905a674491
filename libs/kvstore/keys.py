"""Chunk keys: LMCache's prefix-hash chain, stable across processes and machines.

A prompt is cut into `chunk_tokens`-token chunks (the last may be shorter); chunk i is keyed
by a hash of all tokens up to its end, chained chunk by chunk, so a chunk is found from the
tokens before it. The chain is LMCache's own `TokenHasher` with its "blake3" algorithm:
blake3 over the previous 32-byte digest and the chunk's token ids as big-endian uint32. It
depends on no process state: not PYTHONHASHSEED (LMCache's default "builtin" algorithm and
its ChunkedTokenDatabase fall back to Python's `hash()` without vLLM, and fold digests to 64
bits), not vLLM's NONE_HASH. TokenHasher only hashes whole chunks; the trailing partial
chunk is hashed here with the same `hash_tokens` call, chained on the last whole chunk.

Every key also carries a layout fingerprint (model identity + KV shape and dtype + chunk
size), so KV of another model or layout never shares a key.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.multiprocess.token_hasher import TokenHasher

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.identity import InvalidKey, check_key

HASH_ALGORITHM = "blake3"
# LMCache keys have a model_name field; ours holds "cleave-<layout fingerprint>" so that
# Cleave's entries in a shared Redis or disk directory are recognisable.
KEY_NAMESPACE = "cleave-"
# CacheEngineKey's dtype field: a stored chunk is an opaque byte blob to LMCache.
BLOB_DTYPE = torch.uint8

MAX_TOKEN_ID = 2**32 - 1  # the chain packs token ids as uint32


class ChunkKeyer:
    """Token ids -> chunk keys, with LMCache's TokenHasher (blake3)."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self._hasher = TokenHasher(chunk_size=chunk_tokens, hash_algorithm=HASH_ALGORITHM)

    def keys(self, token_ids: Sequence[int], fingerprint: str) -> list[kvstore_pb2.ChunkKey]:
        tokens = list(token_ids)
        if any(not 0 <= token <= MAX_TOKEN_ID for token in tokens):
            raise InvalidKey("token ids must be in 0..2^32-1")
        digests: list[bytes] = self._hasher.compute_chunk_hashes(tokens)
        tail_start = len(digests) * self.chunk_tokens
        if tail_start < len(tokens):
            prefix = digests[-1] if digests else None
            digests.append(TokenHasher.hash_to_bytes(self._hasher.hash_tokens(tokens[tail_start:], prefix)))
        return [
            kvstore_pb2.ChunkKey(
                prefix_hash=digest.hex(),
                layout_fingerprint=fingerprint,
                chunk_index=index,
                num_tokens=min(self.chunk_tokens, len(tokens) - index * self.chunk_tokens),
            )
            for index, digest in enumerate(digests)
        ]


def engine_key(key: kvstore_pb2.ChunkKey) -> CacheEngineKey:
    """The LMCache key a chunk is stored under in every tier (its Redis key and file name
    come from CacheEngineKey.to_string())."""
    check_key(key)
    return CacheEngineKey(
        model_name=KEY_NAMESPACE + key.layout_fingerprint,
        world_size=1,
        worker_id=0,
        chunk_hash=int(key.prefix_hash, 16),
        dtype=BLOB_DTYPE,
    )
