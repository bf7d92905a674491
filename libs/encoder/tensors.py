"""Image embeddings <-> cleave.common.v1.Tensor (raw little-endian bytes, row-major)."""

from __future__ import annotations

import torch

from cleave.common.v1 import common_pb2

_CODES = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.float16: common_pb2.DTYPE_FLOAT16,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
# bytes <-> tensor through a same-width integer view (numpy has no bfloat16).
_VIEWS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def to_proto(tensor: torch.Tensor) -> common_pb2.Tensor:
    if tensor.dtype not in _CODES:
        raise TypeError(f"no wire dtype for {tensor.dtype}")
    raw = tensor.detach().contiguous().cpu().view(_VIEWS[tensor.dtype]).numpy().tobytes()
    return common_pb2.Tensor(dtype=_CODES[tensor.dtype], shape=list(tensor.shape), data=raw)


def from_proto(message: common_pb2.Tensor) -> torch.Tensor:
    """Raises ValueError for a tensor whose dtype, shape and bytes do not agree."""
    dtype = _DTYPES.get(message.dtype)
    if dtype is None:
        raise ValueError(
            f"image embeddings of dtype {common_pb2.DType.Name(message.dtype)} are not supported"
        )
    shape = [int(d) for d in message.shape]
    if len(shape) != 2 or min(shape) <= 0:
        raise ValueError(f"image embeddings must be [num_tokens, hidden_size], got shape {shape}")
    width = torch.empty((), dtype=dtype).element_size()
    if len(message.data) != shape[0] * shape[1] * width:
        raise ValueError(
            f"image embeddings of shape {shape} need {shape[0] * shape[1] * width} bytes, got {len(message.data)}"
        )
    flat = torch.frombuffer(bytearray(message.data), dtype=_VIEWS[dtype]).view(dtype)
    return flat.reshape(shape)
