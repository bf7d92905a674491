"""KV chunks in and out of storage: validation against the layout, checksums, and the blob
format every tier stores.

A stored blob is self-describing: MAGIC, a crc32c of the rest, then the serialized KvChunk
(key, tensor, the client's crc32c). Each read checks the blob crc and that the blob is the
chunk that was asked for, so a torn disk write, a bit flip, or a foreign value under our
Redis key is rejected instead of served. The blob crc covers the key and shape too, not only
the tensor bytes that KvChunk.crc32c covers.

With an auth key (libs/kvstore/auth.py) the blob is AUTH_MAGIC, the crc, an HMAC-SHA256 tag
over the cache key and the payload, then the payload. Reads from disk and Redis then
require a valid tag (a plain blob is refused too: it could be planted); reads from the
in-process CPU tier check the crc only, since every copy there was checked on its way in.
"""

from __future__ import annotations

import math
import struct
from enum import StrEnum

import google_crc32c
from google.protobuf.message import DecodeError

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.auth import TAG_BYTES, ChunkSealer
from libs.kvstore.identity import InvalidKey, check_key, same_identity

MAGIC = b"CKV1"
AUTH_MAGIC = b"CKA1"
_HEADER = struct.Struct("<4sI")
_AUTH_HEADER = struct.Struct(f"<4sI{TAG_BYTES}s")

ELEMENT_BYTES = {
    common_pb2.DTYPE_FLOAT32: 4,
    common_pb2.DTYPE_FLOAT16: 2,
    common_pb2.DTYPE_BFLOAT16: 2,
    common_pb2.DTYPE_INT8: 1,
    common_pb2.DTYPE_UINT8: 1,
    common_pb2.DTYPE_FP8_E4M3: 1,
    common_pb2.DTYPE_FP8_E5M2: 1,
    common_pb2.DTYPE_MXINT8: 1,
}


class RejectReason(StrEnum):
    CRC = "crc"  # checksum mismatch: corrupt on the wire or in a tier
    LAYOUT = "layout"  # another model or KV layout than the key or request says
    MALFORMED = "malformed"  # bad key, impossible shape or sizes, unreadable blob
    TOO_LARGE = "too_large"  # more than the CPU tier can stage
    NO_MEMORY = "no_memory"  # the CPU tier had no evictable room to stage it
    AUTH = "auth"  # no valid HMAC tag while an auth key is configured (or a tag and no key)


class ChunkRejected(Exception):
    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def tensor_crc32c(tensor: common_pb2.Tensor) -> int:
    """What KvChunk.crc32c must hold: crc32c of kv.data, continued over kv.mx_scales."""
    crc = google_crc32c.value(tensor.data)
    return google_crc32c.extend(crc, tensor.mx_scales) if tensor.mx_scales else crc


def check_chunk(
    chunk: kvstore_pb2.KvChunk, layout: common_pb2.KvLayout, fingerprint: str, chunk_tokens: int
) -> None:
    """Raises ChunkRejected unless `chunk` is well-formed KV of `layout` with a valid crc.

    The tensor's dtype is the layout's KV dtype, or MXINT8 (the lossy wire encoding of
    libs.kvcodec), which a reader recognises by the dtype and decodes.
    """
    key = chunk.key
    try:
        check_key(key)
    except InvalidKey as error:
        raise ChunkRejected(RejectReason.MALFORMED, str(error)) from None
    if key.layout_fingerprint != fingerprint:
        raise ChunkRejected(
            RejectReason.LAYOUT, "the key's layout fingerprint does not match the request's layout"
        )
    if not 0 < key.num_tokens <= chunk_tokens:
        raise ChunkRejected(RejectReason.MALFORMED, f"num_tokens {key.num_tokens} not in 1..{chunk_tokens}")
    kv = chunk.kv
    if kv.dtype not in (layout.kv_dtype, common_pb2.DTYPE_MXINT8):
        raise ChunkRejected(
            RejectReason.LAYOUT,
            f"kv dtype {common_pb2.DType.Name(kv.dtype)} is neither the layout's "
            f"{common_pb2.DType.Name(layout.kv_dtype)} nor MXINT8",
        )
    expected_shape = [layout.num_layers, 2, key.num_tokens, layout.num_kv_heads, layout.head_dim]
    if list(kv.shape) != expected_shape:
        raise ChunkRejected(RejectReason.LAYOUT, f"kv shape {list(kv.shape)} is not {expected_shape}")
    numel = math.prod(expected_shape)
    if len(kv.data) != numel * ELEMENT_BYTES[kv.dtype]:
        raise ChunkRejected(
            RejectReason.MALFORMED, f"kv.data has {len(kv.data)} bytes for shape {expected_shape}"
        )
    if kv.dtype == common_pb2.DTYPE_MXINT8:
        if kv.mx_block_size <= 0:
            raise ChunkRejected(RejectReason.MALFORMED, "MXINT8 needs a positive mx_block_size")
        scales = numel // layout.head_dim * math.ceil(layout.head_dim / kv.mx_block_size)
        if len(kv.mx_scales) != scales:
            raise ChunkRejected(
                RejectReason.MALFORMED, f"MXINT8 needs {scales} scale bytes, got {len(kv.mx_scales)}"
            )
    elif kv.mx_scales:
        raise ChunkRejected(RejectReason.MALFORMED, "mx_scales set on a non-MXINT8 tensor")
    if tensor_crc32c(kv) != chunk.crc32c:
        raise ChunkRejected(RejectReason.CRC, "crc32c does not match kv.data and kv.mx_scales")


def encode_blob(chunk: kvstore_pb2.KvChunk, sealer: ChunkSealer | None = None) -> bytes:
    payload = chunk.SerializeToString(deterministic=True)
    crc = google_crc32c.value(payload)
    if sealer is None:
        return _HEADER.pack(MAGIC, crc) + payload
    return _AUTH_HEADER.pack(AUTH_MAGIC, crc, sealer.tag(chunk.key, payload)) + payload


def decode_blob(
    blob: bytes,
    expected: kvstore_pb2.ChunkKey,
    sealer: ChunkSealer | None = None,
    *,
    authenticate: bool = True,
) -> kvstore_pb2.KvChunk:
    """The chunk in `blob`, or ChunkRejected if the blob is damaged, is another chunk, or
    (with a `sealer` and `authenticate`) lacks a valid tag for `expected`."""
    # bytes, not memoryviews: google_crc32c and upb's parser both refuse memoryviews.
    if len(blob) < _HEADER.size:
        raise ChunkRejected(RejectReason.MALFORMED, f"blob of {len(blob)} bytes has no header")
    magic, crc = _HEADER.unpack_from(blob)
    if magic == MAGIC:
        if sealer is not None and authenticate:
            raise ChunkRejected(RejectReason.AUTH, "stored blob has no tag, and this store requires one")
        payload = blob[_HEADER.size :]
    elif magic == AUTH_MAGIC:
        if sealer is None:
            raise ChunkRejected(RejectReason.AUTH, "stored blob is tagged, and this store has no auth key")
        if len(blob) < _AUTH_HEADER.size:
            raise ChunkRejected(RejectReason.MALFORMED, f"tagged blob of {len(blob)} bytes has no header")
        _magic, crc, tag = _AUTH_HEADER.unpack_from(blob)
        payload = blob[_AUTH_HEADER.size :]
        if authenticate and not sealer.verify(expected, payload, tag):
            raise ChunkRejected(RejectReason.AUTH, "stored blob fails its HMAC tag")
    else:
        raise ChunkRejected(RejectReason.MALFORMED, f"blob starts with {magic!r}, not {MAGIC!r}")
    if google_crc32c.value(payload) != crc:
        raise ChunkRejected(RejectReason.CRC, "stored blob fails its crc32c")
    chunk = kvstore_pb2.KvChunk()
    try:
        chunk.ParseFromString(payload)
    except DecodeError as error:  # crc matched, so this is a bug or a foreign writer
        raise ChunkRejected(RejectReason.MALFORMED, f"stored blob does not parse: {error}") from None
    if chunk.key.layout_fingerprint != expected.layout_fingerprint:
        raise ChunkRejected(RejectReason.LAYOUT, "stored chunk belongs to another layout")
    if not same_identity(chunk.key, expected):
        raise ChunkRejected(RejectReason.MALFORMED, "stored chunk has another prefix hash than its key")
    return chunk
