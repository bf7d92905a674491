"""Chunk identity without LMCache: layout fingerprints and key checks.

Kept free of LMCache and torch imports so that clients (a vLLM connector computing crcs,
tests) can use it cheaply; key derivation from tokens is in keys.py.
"""

from __future__ import annotations

import hashlib
import json
import re

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2

# Bumped when the stored chunk format (libs/kvstore/chunks.py) changes incompatibly: old
# chunks then stop matching instead of being misread.
FORMAT_VERSION = 1
PREFIX_HASH_HEX_DIGITS = 64
FINGERPRINT_HEX_DIGITS = 32
_PREFIX_HASH = re.compile(r"^[0-9a-f]{64}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{32}$")


class InvalidKey(ValueError):
    """A key, layout or token id that cannot be a valid chunk key."""


def layout_fingerprint(layout: common_pb2.KvLayout, chunk_tokens: int) -> str:
    """32 hex digits identifying the model and KV layout that chunks were computed with.

    `block_size` is left out on purpose: a chunk is a dense [layers, 2, tokens, heads, dim]
    tensor, whatever paging the engine that computed it used, so engines with different
    block sizes can share chunks.
    """
    if not layout.model_fingerprint:
        raise InvalidKey("layout.model_fingerprint is empty")
    if layout.kv_dtype == common_pb2.DTYPE_UNSPECIFIED:
        raise InvalidKey("layout.kv_dtype is unspecified")
    if min(layout.num_layers, layout.num_kv_heads, layout.head_dim) <= 0:
        raise InvalidKey("layout.num_layers, num_kv_heads and head_dim must be positive")
    canonical = json.dumps(
        {
            "format": FORMAT_VERSION,
            "model": layout.model_fingerprint,
            "kv_dtype": common_pb2.DType.Name(layout.kv_dtype),
            "num_layers": layout.num_layers,
            "num_kv_heads": layout.num_kv_heads,
            "head_dim": layout.head_dim,
            "chunk_tokens": chunk_tokens,
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_HEX_DIGITS]


def check_key(key: kvstore_pb2.ChunkKey) -> None:
    if not _PREFIX_HASH.match(key.prefix_hash):
        raise InvalidKey(f"prefix_hash must be {PREFIX_HASH_HEX_DIGITS} lowercase hex digits")
    if not _FINGERPRINT.match(key.layout_fingerprint):
        raise InvalidKey(f"layout_fingerprint must be {FINGERPRINT_HEX_DIGITS} lowercase hex digits")


def same_identity(a: kvstore_pb2.ChunkKey, b: kvstore_pb2.ChunkKey) -> bool:
    """Two keys name the same chunk: the prefix hash fixes the tokens (and so chunk_index and
    num_tokens), the fingerprint fixes the layout."""
    return a.prefix_hash == b.prefix_hash and a.layout_fingerprint == b.layout_fingerprint
