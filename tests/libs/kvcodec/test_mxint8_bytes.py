from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch

from libs.kvcodec.mxint8 import decode, encode, encoded_nbytes, from_bytes, header_nbytes, to_bytes

SMOLLM2_KV = (30, 2, 2048, 3, 64)  # layers, k/v, tokens, kv heads, head dim


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1,), (33,), (2, 3, 64), (4, 100), (0,), (0, 64), (5, 0)])
def test_bytes_round_trip_and_size(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    if x.numel() > 40:
        x.view(-1)[40] = math.nan
    mx = encode(x)
    blob = to_bytes(mx)
    assert isinstance(blob, bytes)
    assert len(blob) == encoded_nbytes(shape) == header_nbytes(len(shape)) + mx.nbytes
    back = from_bytes(blob)
    assert back.shape == shape and back.dtype == dtype
    assert torch.equal(back.elements, mx.elements) and torch.equal(back.scales, mx.scales)
    assert_same(decode(back), decode(mx))


def test_kv_chunk_is_33_64ths_of_bf16_plus_a_header() -> None:
    n = math.prod(SMOLLM2_KV)
    payload = encoded_nbytes(SMOLLM2_KV) - header_nbytes(len(SMOLLM2_KV))
    assert payload == n + n // 32  # one int8 per value, one E8M0 byte per 32 values
    ratio = Fraction(payload, 2 * n)  # bf16: two bytes per value
    assert ratio == Fraction(33, 64)
    assert round(float(ratio), 3) == 0.516
    assert header_nbytes(len(SMOLLM2_KV)) / (2 * n) < 1e-5  # the header is noise at this size


def test_encoded_size_matches_a_real_kv_shaped_blob() -> None:
    shape = (2, 2, 16, 3, 64)
    blob = to_bytes(encode(torch.randn(shape).to(torch.bfloat16)))
    n = math.prod(shape)
    assert len(blob) - header_nbytes(len(shape)) == n + n // 32


def test_partial_blocks_cost_one_scale_byte_each() -> None:
    assert encoded_nbytes((3, 33)) - header_nbytes(2) == 3 * 33 + 3 * 2
    assert encoded_nbytes((7,)) - header_nbytes(1) == 7 + 1
    assert encoded_nbytes((4, 0)) == header_nbytes(2)


def test_from_bytes_accepts_buffers_and_copies_them() -> None:
    x = torch.randn(3, 64)
    blob = bytearray(to_bytes(encode(x)))
    mx = from_bytes(blob)
    expected = decode(mx).clone()
    blob[header_nbytes(2) :] = bytes(len(blob) - header_nbytes(2))
    assert torch.equal(decode(mx), expected)  # independent of the buffer it came from
    assert torch.equal(decode(from_bytes(memoryview(to_bytes(mx)))), expected)


def test_from_bytes_rejects_malformed_blobs() -> None:
    blob = to_bytes(encode(torch.randn(2, 64)))
    with pytest.raises(ValueError, match="needs"):
        from_bytes(blob[:-1])
    with pytest.raises(ValueError, match="needs"):
        from_bytes(blob + b"\0")
    with pytest.raises(ValueError, match="magic"):
        from_bytes(b"XXXX" + blob[4:])
    with pytest.raises(ValueError, match="version"):
        from_bytes(blob[:4] + b"\x09" + blob[5:])
    with pytest.raises(ValueError, match="dtype code"):
        from_bytes(blob[:5] + b"\x63" + blob[6:])
    with pytest.raises(ValueError, match="too short"):
        from_bytes(blob[:3])
    with pytest.raises(ValueError, match="truncated"):
        from_bytes(blob[:10])
    huge = blob[:7] + struct.pack("<2Q", 2**40, 64)
    with pytest.raises(ValueError, match="needs"):
        from_bytes(huge)
