"""Test helpers for the kvstore: a tiny KV layout, chunk builders, prompts, a fake clock."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.chunks import ELEMENT_BYTES, tensor_crc32c
from libs.kvstore.store import KvStore

CHUNK_TOKENS = 16
# 2 layers x K,V x 16 tokens x 2 heads x 8 dims x bf16 = 2 KiB per full chunk; a stored blob
# adds its key and header and takes one 4 KiB allocation.
LAYOUT = common_pb2.KvLayout(
    model_fingerprint="tiny-llama-test",
    block_size=16,
    kv_dtype=common_pb2.DTYPE_BFLOAT16,
    num_layers=2,
    num_kv_heads=2,
    head_dim=8,
)
BLOB_ALLOCATION = 4096


def with_layout(**changes: object) -> common_pb2.KvLayout:
    """LAYOUT with some fields changed."""
    layout = common_pb2.KvLayout()
    layout.CopyFrom(LAYOUT)
    for name, value in changes.items():
        setattr(layout, name, value)
    return layout


def make_chunk(
    key: kvstore_pb2.ChunkKey, layout: common_pb2.KvLayout = LAYOUT, seed: int = 0
) -> kvstore_pb2.KvChunk:
    shape = [layout.num_layers, 2, key.num_tokens, layout.num_kv_heads, layout.head_dim]
    nbytes = ELEMENT_BYTES[layout.kv_dtype] * shape[0] * shape[1] * shape[2] * shape[3] * shape[4]
    data = random.Random(f"{key.prefix_hash}/{seed}").randbytes(nbytes)
    kv = common_pb2.Tensor(dtype=layout.kv_dtype, shape=shape, data=data)
    return kvstore_pb2.KvChunk(key=key, kv=kv, crc32c=tensor_crc32c(kv))


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(length)]


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


StoreFactory = Callable[..., KvStore]


def put_prompt(
    store: KvStore, tokens: Sequence[int], layout: common_pb2.KvLayout = LAYOUT
) -> list[kvstore_pb2.KvChunk]:
    chunks = [make_chunk(key, layout) for key in store.chunk_keys(tokens, layout)]
    store.put(layout, chunks)
    return chunks
