"""KV chunks in and out of vLLM's paged KV cache, and to and from the contract's Tensor.

A chunk on the wire and in the kvstore is dense: [num_layers, 2 (K, V), num_tokens,
num_kv_heads, head_dim] (protos/cleave/kvstore/v1). vLLM's CPU attention keeps each layer as
[num_blocks, num_kv_heads, block_size, 2 * head_dim] (its "LBHNC" layout, K then V in the
last axis). Token t of a request lives in block block_ids[t // block_size] at offset
t % block_size. Only this module knows both shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cleave.common.v1 import common_pb2
from libs.kvcodec import mxint8

TORCH_TO_PROTO = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.float16: common_pb2.DTYPE_FLOAT16,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
}
PROTO_TO_TORCH = {proto: dtype for dtype, proto in TORCH_TO_PROTO.items()}


class UnsupportedKvLayout(ValueError):
    """The engine's KV cache is not laid out as this module expects."""


def check_layer_shape(
    name: str, layer: torch.Tensor, block_size: int, num_kv_heads: int, head_dim: int
) -> None:
    expected = (num_kv_heads, block_size, 2 * head_dim)
    if layer.dim() != 4 or tuple(layer.shape[1:]) != expected:
        raise UnsupportedKvLayout(
            f"KV cache layer {name} has shape {tuple(layer.shape)}; the kvstore connector reads "
            f"vLLM's CPU layout [blocks, {num_kv_heads}, {block_size}, {2 * head_dim}]"
        )
    if layer.dtype not in TORCH_TO_PROTO:
        raise UnsupportedKvLayout(f"KV cache dtype {layer.dtype} is not one the kvstore stores")


def _slots(
    block_ids: Sequence[int], block_size: int, start: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(start, end)
    blocks = torch.as_tensor(block_ids, dtype=torch.long)[positions // block_size]
    return blocks, positions % block_size


def gather(
    layers: Sequence[torch.Tensor], block_ids: Sequence[int], block_size: int, start: int, end: int
) -> torch.Tensor:
    """Tokens [start, end) of a request as a dense [L, 2, T, H, D] tensor (a copy)."""
    blocks, offsets = _slots(block_ids, block_size, start, end)
    per_layer = torch.stack([layer[blocks, :, offsets] for layer in layers])  # [L, T, H, 2D]
    num_layers, tokens, heads, both = per_layer.shape
    return per_layer.view(num_layers, tokens, heads, 2, both // 2).permute(0, 3, 1, 2, 4).contiguous()


def scatter(
    chunk: torch.Tensor,
    layers: Sequence[torch.Tensor],
    block_ids: Sequence[int],
    block_size: int,
    start: int,
) -> None:
    """Writes a dense [L, 2, T, H, D] chunk into tokens [start, start + T) of a request."""
    num_layers, _, tokens, heads, head_dim = chunk.shape
    if num_layers != len(layers):
        raise ValueError(f"chunk has {num_layers} layers, the cache {len(layers)}")
    blocks, offsets = _slots(block_ids, block_size, start, start + tokens)
    per_layer = chunk.permute(0, 2, 3, 1, 4).reshape(num_layers, tokens, heads, 2 * head_dim)
    for layer, values in zip(layers, per_layer, strict=True):
        layer[blocks, :, offsets] = values.to(layer.dtype)


def to_proto(chunk: torch.Tensor, *, encode_mxint8: bool) -> common_pb2.Tensor:
    """The contract's Tensor for a dense chunk; MXINT8 (libs.kvcodec) when asked, about half
    the bytes of bf16 and a quarter of fp32."""
    shape = list(chunk.shape)
    if encode_mxint8:
        mx = mxint8.encode(chunk)
        return common_pb2.Tensor(
            dtype=common_pb2.DTYPE_MXINT8,
            shape=shape,
            data=mx.elements.contiguous().numpy().tobytes(),
            mx_scales=mx.scales.contiguous().numpy().tobytes(),
            mx_block_size=mxint8.BLOCK_SIZE,
        )
    return common_pb2.Tensor(
        dtype=TORCH_TO_PROTO[chunk.dtype],
        shape=shape,
        data=chunk.contiguous().view(torch.uint8).numpy().tobytes(),
    )


def from_proto(tensor: common_pb2.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dense chunk in `dtype` from the contract's Tensor (already crc- and shape-checked by
    the kvstore; MXINT8 is decoded)."""
    shape = tuple(int(d) for d in tensor.shape)
    if tensor.dtype == common_pb2.DTYPE_MXINT8:
        elements = torch.frombuffer(bytearray(tensor.data), dtype=torch.int8).reshape(shape)
        scales = torch.frombuffer(bytearray(tensor.mx_scales), dtype=torch.uint8).reshape(
            mxint8.scales_shape(shape)
        )
        return mxint8.decode(
            mxint8.MxTensor(elements=elements, scales=scales, shape=shape, dtype=dtype), dtype
        )
    source = PROTO_TO_TORCH.get(tensor.dtype)
    if source is None:
        raise ValueError(f"cannot load KV of dtype {common_pb2.DType.Name(tensor.dtype)}")
    return torch.frombuffer(bytearray(tensor.data), dtype=torch.uint8).view(source).reshape(shape).to(dtype)
