"""Chunk validation against a layout, checksums, and the stored blob format."""

from __future__ import annotations

import pytest

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.chunks import (
    ChunkRejected,
    RejectReason,
    check_chunk,
    decode_blob,
    encode_blob,
    tensor_crc32c,
)
from libs.kvstore.identity import layout_fingerprint
from libs.kvstore.keys import ChunkKeyer
from tests.libs.kvstore.helpers import CHUNK_TOKENS, LAYOUT, make_chunk, prompt, with_layout

FP = layout_fingerprint(LAYOUT, CHUNK_TOKENS)


def keys(length: int = 20, seed: int = 0) -> list[kvstore_pb2.ChunkKey]:
    return ChunkKeyer(CHUNK_TOKENS).keys(prompt(seed, length), FP)


def reason(chunk: kvstore_pb2.KvChunk, fingerprint: str = FP) -> RejectReason | None:
    try:
        check_chunk(chunk, LAYOUT, fingerprint, CHUNK_TOKENS)
    except ChunkRejected as rejection:
        return rejection.reason
    return None


def test_well_formed_chunks_pass_full_and_partial() -> None:
    full, partial = keys(20)
    assert reason(make_chunk(full)) is None
    assert reason(make_chunk(partial)) is None  # 4 tokens


def test_a_flipped_data_byte_fails_the_crc() -> None:
    chunk = make_chunk(keys()[0])
    data = bytearray(chunk.kv.data)
    data[100] ^= 0x01
    chunk.kv.data = bytes(data)
    assert reason(chunk) is RejectReason.CRC


def test_another_layouts_chunk_is_a_layout_mismatch() -> None:
    chunk = make_chunk(keys()[0])
    other = layout_fingerprint(with_layout(num_layers=4), CHUNK_TOKENS)
    assert reason(chunk, fingerprint=other) is RejectReason.LAYOUT


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.kv.shape.__setitem__(0, 3), RejectReason.LAYOUT),  # layers
        (lambda c: c.kv.shape.__setitem__(3, 1), RejectReason.LAYOUT),  # kv heads
        (lambda c: c.kv.shape.__setitem__(2, 15), RejectReason.LAYOUT),  # tokens vs key.num_tokens
        (lambda c: setattr(c.kv, "dtype", common_pb2.DTYPE_FLOAT16), RejectReason.LAYOUT),
        (lambda c: setattr(c.kv, "data", c.kv.data[:-2]), RejectReason.MALFORMED),
        (lambda c: setattr(c.key, "num_tokens", CHUNK_TOKENS + 1), RejectReason.MALFORMED),
        (lambda c: setattr(c.key, "prefix_hash", "zz"), RejectReason.MALFORMED),
        (lambda c: setattr(c.kv, "mx_scales", b"\x00"), RejectReason.MALFORMED),
    ],
)
def test_shape_dtype_and_size_mismatches_are_rejected(mutate, expected: RejectReason) -> None:  # type: ignore[no-untyped-def]
    chunk = make_chunk(keys()[0])
    mutate(chunk)
    chunk.crc32c = tensor_crc32c(chunk.kv)  # so only the mutation itself can fail
    assert reason(chunk) is expected


def test_mxint8_chunks_need_one_scale_per_block() -> None:
    key = keys()[0]
    numel = LAYOUT.num_layers * 2 * key.num_tokens * LAYOUT.num_kv_heads * LAYOUT.head_dim
    kv = common_pb2.Tensor(
        dtype=common_pb2.DTYPE_MXINT8,
        shape=[LAYOUT.num_layers, 2, key.num_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim],
        data=bytes(numel),
        mx_scales=bytes(numel // LAYOUT.head_dim),  # head_dim 8 <= block 32: one scale per row
        mx_block_size=32,
    )
    good = kvstore_pb2.KvChunk(key=key, kv=kv, crc32c=tensor_crc32c(kv))
    assert reason(good) is None
    short = kvstore_pb2.KvChunk()
    short.CopyFrom(good)
    short.kv.mx_scales = short.kv.mx_scales[:-1]
    short.crc32c = tensor_crc32c(short.kv)
    assert reason(short) is RejectReason.MALFORMED
    # The crc covers the scales too.
    flipped = kvstore_pb2.KvChunk()
    flipped.CopyFrom(good)
    flipped.kv.mx_scales = b"\x01" + flipped.kv.mx_scales[1:]
    assert reason(flipped) is RejectReason.CRC


def test_blob_round_trip_and_any_flipped_byte_is_detected() -> None:
    chunk = make_chunk(keys()[0])
    blob = encode_blob(chunk)
    assert decode_blob(blob, chunk.key) == chunk
    for position in (0, 5, 8, 20, len(blob) // 2, len(blob) - 1):  # magic, crc, key, data
        damaged = bytearray(blob)
        damaged[position] ^= 0x40
        with pytest.raises(ChunkRejected):
            decode_blob(bytes(damaged), chunk.key)
    with pytest.raises(ChunkRejected) as truncated:
        decode_blob(blob[: len(blob) // 2], chunk.key)  # a torn write
    assert truncated.value.reason is RejectReason.CRC


def test_a_blob_of_another_chunk_or_layout_is_not_accepted() -> None:
    first, second = keys(32)
    blob = encode_blob(make_chunk(first))
    with pytest.raises(ChunkRejected) as other_chunk:
        decode_blob(blob, second)
    assert other_chunk.value.reason is RejectReason.MALFORMED
    elsewhere = kvstore_pb2.ChunkKey()
    elsewhere.CopyFrom(first)
    elsewhere.layout_fingerprint = "0" * 32
    with pytest.raises(ChunkRejected) as other_layout:
        decode_blob(blob, elsewhere)
    assert other_layout.value.reason is RejectReason.LAYOUT
