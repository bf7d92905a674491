"""Dense chunks in and out of a paged KV cache laid out as vLLM's CPU attention keeps it."""

from __future__ import annotations

import pytest
import torch

from cleave.common.v1 import common_pb2
from libs.kvconnector import paged

LAYERS, BLOCKS, HEADS, BLOCK, DIM = 3, 8, 2, 4, 32


def cache(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(BLOCKS, HEADS, BLOCK, 2 * DIM, generator=generator).to(dtype) for _ in range(LAYERS)]


def test_gather_reads_k_then_v_of_each_token_from_its_block() -> None:
    layers = cache()
    block_ids = [5, 2, 7]
    chunk = paged.gather(layers, block_ids, BLOCK, start=2, end=10)
    assert chunk.shape == (LAYERS, 2, 8, HEADS, DIM)
    token = 6  # block_ids[1] = 2, offset 2
    assert torch.equal(chunk[1, 0, token - 2], layers[1][2, :, 2, :DIM])
    assert torch.equal(chunk[1, 1, token - 2], layers[1][2, :, 2, DIM:])


def test_scatter_then_gather_round_trips_into_other_blocks() -> None:
    source, target = cache(), [torch.zeros(BLOCKS, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    chunk = paged.gather(source, [1, 3, 0], BLOCK, start=0, end=12)
    paged.scatter(chunk, target, [6, 4, 2], BLOCK, start=0)
    assert torch.equal(paged.gather(target, [6, 4, 2], BLOCK, start=0, end=12), chunk)
    untouched = [b for b in range(BLOCKS) if b not in (6, 4, 2)]
    assert all(float(layer[untouched].abs().sum()) == 0 for layer in target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_proto_round_trip_is_exact_in_the_native_dtype(dtype: torch.dtype) -> None:
    chunk = paged.gather(cache(dtype), [0, 1], BLOCK, 0, 8)
    proto = paged.to_proto(chunk, encode_mxint8=False)
    assert proto.dtype == paged.TORCH_TO_PROTO[dtype] and list(proto.shape) == list(chunk.shape)
    assert torch.equal(paged.from_proto(proto, dtype), chunk)


def test_mxint8_halves_bf16_bytes_within_the_codec_bound() -> None:
    chunk = paged.gather(cache(torch.bfloat16), [0, 1], BLOCK, 0, 8)
    native = paged.to_proto(chunk, encode_mxint8=False)
    mx = paged.to_proto(chunk, encode_mxint8=True)
    assert mx.dtype == common_pb2.DTYPE_MXINT8 and mx.mx_block_size == 32
    assert len(mx.data) + len(mx.mx_scales) < 0.53 * len(native.data)
    decoded = paged.from_proto(mx, torch.bfloat16).float()
    block_max = chunk.float().abs().amax(dim=-1, keepdim=True)  # DIM == one MX block
    assert bool(((decoded - chunk.float()).abs() <= block_max / 128).all())


def test_an_unexpected_cache_shape_is_refused_with_its_shape() -> None:
    with pytest.raises(paged.UnsupportedKvLayout, match=r"\(2, 8, 4, 2, 32\)"):
        paged.check_layer_shape("layers.0", torch.zeros(2, BLOCKS, BLOCK, HEADS, DIM), BLOCK, HEADS, DIM)
