"""Chunk keys: LMCache's prefix-hash chain, stable across processes and machines.

A prompt is cut into `chunk_tokens`-token chunks (the last may be shorter); chunk i is keyed
by a hash of all tokens up to its end, chained chunk by chunk, so a chunk is found from the
tokens before it. The chain is LMCache's own `TokenHasher` with its "blake3" algorithm:
blake3 over the previous 32-byte digest and the chunk's token ids as big-endian uint32. It
depends on no process state: not PYTHONHASHSEED (LMCache's default "builtin" algorithm and
its ChunkedTokenDatabase fall back to Python's `hash()` without vLLM, and fold digests to 64
bits), not vLLM's NONE_HASH. TokenHasher only hashes whole chunks; the trailing partial
chunk is hashed here with the same `hash_tokens` call, chained on the last whole chunk.

A request's cache salt (vLLM's `cache_salt`, RequestMetadata.cache_salt) seeds the chain: the
first chunk is hashed on blake3("cleave-cache-salt", salt) instead of LMCache's NONE_HASH, so
salted chunks have other keys than the same tokens unsalted or under another salt, and
every later chunk inherits that. As in vLLM's prefix cache, a prefix is shared only among
requests that carry the same salt. A request served with a LoRA adapter (RequestMetadata.lora)
seeds the chain from the salt, the adapter's name and its path together (vLLM folds name and
path into its block hashes alike): KV computed under one adapter is never found for another
adapter or for the base model.

Every key also carries a layout fingerprint (model identity + KV shape and dtype + chunk
size), so KV of another model or layout never shares a key.
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.multiprocess.token_hasher import TokenHasher

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.identity import InvalidKey, check_key

HASH_ALGORITHM = "blake3"
# LMCache keys have a model_name field; ours holds "cleave-<layout fingerprint>" so that
# Cleave's entries in a shared Redis or disk directory are recognisable.
KEY_NAMESPACE = "cleave-"
# CacheEngineKey's dtype field: a stored chunk is an opaque byte blob to LMCache.
BLOB_DTYPE = torch.uint8

MAX_TOKEN_ID = 2**32 - 1  # the chain packs token ids as uint32
_SALT_DOMAIN = b"cleave-cache-salt\0"
_LORA_DOMAIN = b"cleave-lora\0"


def salt_root(cache_salt: str, lora: common_pb2.LoraAdapter | None = None) -> bytes | None:
    """The chain's starting digest for a salt and adapter; None (LMCache's default) for
    neither. Each part is length-prefixed, so no salt can spell another salt and adapter."""
    if lora is not None:
        parts = (cache_salt.encode(), lora.name.encode(), lora.path.encode())
        return blake3.blake3(_LORA_DOMAIN + b"".join(len(p).to_bytes(4, "big") + p for p in parts)).digest()
    if not cache_salt:
        return None
    return blake3.blake3(_SALT_DOMAIN + cache_salt.encode()).digest()


class ChunkKeyer:
    """Token ids -> chunk keys, with LMCache's TokenHasher (blake3)."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self._hasher = TokenHasher(chunk_size=chunk_tokens, hash_algorithm=HASH_ALGORITHM)

    def keys(
        self,
        token_ids: Sequence[int],
        fingerprint: str,
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> list[kvstore_pb2.ChunkKey]:
        tokens = list(token_ids)
        if any(not 0 <= token <= MAX_TOKEN_ID for token in tokens):
            raise InvalidKey("token ids must be in 0..2^32-1")
        root = salt_root(cache_salt, lora)
        digests: list[bytes] = self._hasher.compute_chunk_hashes(tokens, prefix_hash=root)
        tail_start = len(digests) * self.chunk_tokens
        if tail_start < len(tokens):
            prefix = digests[-1] if digests else root
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
