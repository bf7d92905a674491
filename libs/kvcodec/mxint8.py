"""MXINT8 codec (OCP Microscaling Formats spec v1.0) for KV-cache chunks.

Each run of 32 consecutive values along the last axis (a block) shares one E8M0 scale: a
power-of-two exponent E stored as a uint8 with bias 127 (0..254 -> 2^-127..2^127, 255 = NaN).
Each value is an int8 holding a 1.6 fixed-point number, so it decodes as ``q / 64 * 2^E``.
Following the spec, ``E = floor(log2(max |x| in block))`` (MXINT8's emax_elem is 0) and
``q = round_half_even(x / 2^E * 64)``.

Choices the spec leaves to the implementation, all tested in tests/libs/kvcodec:

* Saturation is symmetric: q is clamped to [-127, 127] (-128 is never produced), so negation
  commutes with encoding. Only values within half an LSB of 2^(E+1) (at most the block's
  largest ones) saturate.
* An all-zero block gets scale byte 0 (2^-127) and zero elements: it decodes to exact zeros
  (-0.0 decodes as +0.0).
* A block holding a NaN gets the NaN scale (255), as the spec says, so all 32 of its values
  decode as NaN; its elements are stored as 0 so the encoding is deterministic.
* A block holding +-Inf is treated like NaN (scale 255). int8 has no Inf, and saturating would
  give the block the scale 2^127, which silently flushes every other value in it to zero and
  turns an overflow into a plausible finite number. NaN keeps the fault visible and confined
  to 32 values.
* E is clamped to E8M0's range [-127, 127]. A block whose largest magnitude is below 2^-127
  (fp32/bf16 subnormals) uses E = -127, so its values keep an absolute error <= 2^-134.
  Finite fp32/bf16/fp16 values never exceed 2^128, so the upper clamp never bites.
* A last axis that is not a multiple of 32 is zero-padded internally; ``elements`` keeps the
  exact original shape, only the last block's scale covers fewer than 32 values.

Error bound: for a block with exponent E every decoded value is within 2^(E-7) (half an LSB)
of the input unless it saturated, and within 2^(E-6) if it did. Relative to the block's
largest magnitude amax (in [2^E, 2^(E+1)) unless E was clamped) both give |error| <= amax/128:
a saturated x is below 2^(E+1) = 128 LSB and decodes to 127 LSB. Relative to a value itself
there is no bound: values far below amax keep only the absolute bound.

Decoding into bfloat16, float32 or float64 is exact: q * 2^(E-6) has at most 7 significant
bits and its exponent fits, so the output holds the encoded value itself, not a rounding of it.
float16 output is computed in float32 and rounded once; values beyond its range become Inf.
Subnormal inputs and outputs rely on torch's default of not flushing denormals.

PyTorch 2.13 has the E8M0 dtype (``torch.float8_e8m0fnu``) but no MXINT8 quantizer (its
private MX helpers cover MXFP8/MXFP4 only); the dtype is used here to turn scale bytes into
powers of two.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

BLOCK_SIZE = 32
SCALE_BIAS = 127
SCALE_NAN = 255
MIN_EXPONENT = -127
MAX_EXPONENT = 127
FRACTION_BITS = 6  # int8 element = sign, 1 integer bit, 6 fractional bits
ELEMENT_MAX = 127

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Serialized form: magic, format version, dtype code, ndim, then ndim little-endian uint64
# dimensions, then the scales (uint8), then the elements (int8), both row-major.
_MAGIC = b"MXI8"
_VERSION = 1
_FIXED_HEADER = struct.Struct("<4sBBB")
_DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

# Encoding's working dtypes as integers: (bit-pattern dtype, sign-clearing mask, mantissa bits).
_BIT_LAYOUT = {
    torch.bfloat16: (torch.int16, 0x7FFF, 7),
    torch.float32: (torch.int32, 0x7FFFFFFF, 23),
}


@dataclass(frozen=True, eq=False)
class MxTensor:
    """An MXINT8-encoded tensor.

    ``elements`` has exactly ``shape``; ``scales`` has ``shape[:-1] + (ceil(shape[-1] / 32),)``,
    one biased exponent per 32-value block of the last axis. ``dtype`` is the source dtype,
    the default for decode.
    """

    elements: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.elements.dtype != torch.int8 or self.scales.dtype != torch.uint8:
            raise ValueError(
                f"elements must be int8 and scales uint8, got {self.elements.dtype} and {self.scales.dtype}"
            )
        if tuple(self.elements.shape) != self.shape:
            raise ValueError(f"elements shape {tuple(self.elements.shape)} != shape {self.shape}")
        if tuple(self.scales.shape) != scales_shape(self.shape):
            raise ValueError(f"scales shape {tuple(self.scales.shape)} != {scales_shape(self.shape)}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported source dtype {self.dtype}")

    @property
    def nbytes(self) -> int:
        """Payload bytes (elements + scales), without the serialization header."""
        return self.elements.numel() + self.scales.numel()


def scales_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the scale tensor for a tensor of ``shape``."""
    _check_shape(shape)
    return (*shape[:-1], -(-shape[-1] // BLOCK_SIZE))


def header_nbytes(ndim: int) -> int:
    """Bytes of the serialization header for a tensor with ``ndim`` dimensions."""
    return _FIXED_HEADER.size + 8 * ndim


def encoded_nbytes(shape: tuple[int, ...]) -> int:
    """Exact length of ``to_bytes`` for a tensor of ``shape``: header + n + ceil-blocks."""
    return header_nbytes(len(shape)) + math.prod(shape) + math.prod(scales_shape(shape))


def encode(t: torch.Tensor) -> MxTensor:
    """Encode a bf16/fp16/fp32 tensor (any device, at least 1-D) block-wise along its last axis."""
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"MXINT8 encodes {SUPPORTED_DTYPES}, got {t.dtype}")
    shape = tuple(t.shape)
    _check_shape(shape)
    lead, last = shape[:-1], shape[-1]
    nblocks = scales_shape(shape)[-1]
    pad = nblocks * BLOCK_SIZE - last

    # bf16 shares fp32's exponent range, so every step below is exact in bf16 too and it
    # stays native (half the memory traffic); fp16 cannot hold 2^(6-E), so it goes to fp32.
    x = t.detach()
    if x.dtype == torch.float16:
        x = x.to(torch.float32)
    if pad:
        x = F.pad(x, (0, pad))
    blocks = x.reshape(*lead, nblocks, BLOCK_SIZE)

    # The E8M0 scale byte is the IEEE exponent field of the block's largest magnitude:
    # floor(log2(amax)) + 127 for normal amax, 0 for zero or subnormal amax (= the clamp to
    # 2^-127, and our all-zero-block scale), 255 for Inf/NaN (E8M0's NaN). Sign-cleared bit
    # patterns order like the magnitudes they encode, with Inf and NaN above every finite
    # value, so an integer max finds it; integer reductions are also much faster than bf16 ones.
    bits_dtype, magnitude_mask, mantissa_bits = _BIT_LAYOUT[x.dtype]
    magnitude = blocks.view(bits_dtype).bitwise_and(magnitude_mask)
    biased = magnitude.amax(dim=-1).bitwise_right_shift(mantissa_bits).to(torch.int32)
    scales = biased.to(torch.uint8)

    # Elements = x * 2^(6-E), built from exponent bits: 2^(6-E) has biased exponent 260 - b.
    # Multiplying by a power of two is exact unless the product is subnormal, and those are
    # far below 0.5 and round to 0 anyway. For E < -121 (b < 6) 2^(6-E) exceeds fp32's range,
    # so those rare blocks take 2^127 first and the rest in a second exact multiply.
    factor = _power_of_two((260 - biased).clamp_(max=254), x.dtype)
    scaled = blocks * factor.unsqueeze(-1)
    tiny = biased < 6
    if bool(tiny.any()):
        scaled.mul_(_power_of_two(127 + (6 - biased).clamp_(min=0), x.dtype).unsqueeze(-1))
    scaled.round_().clamp_(-ELEMENT_MAX, ELEMENT_MAX)  # torch.round is round-half-to-even
    nonfinite = biased == SCALE_NAN
    if bool(nonfinite.any()):
        scaled.masked_fill_(nonfinite.unsqueeze(-1), 0)  # the NaN scale decides; keep bytes deterministic
    elements = scaled.to(torch.int8).reshape(*lead, nblocks * BLOCK_SIZE)
    if pad:
        elements = elements[..., :last].contiguous()
    return MxTensor(elements=elements, scales=scales, shape=shape, dtype=t.dtype)


def decode(mx: MxTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode to ``dtype`` (default: the source dtype), on the device the encoding lives on."""
    out_dtype = mx.dtype if dtype is None else dtype
    if not out_dtype.is_floating_point:
        raise TypeError(f"decode produces a floating-point tensor, not {out_dtype}")
    lead, last = mx.shape[:-1], mx.shape[-1]
    nblocks = mx.scales.shape[-1]
    pad = nblocks * BLOCK_SIZE - last

    # Products q * 2^(E-6) are exact in bf16/fp32/fp64 (down to 2^-133, a bf16/fp32
    # subnormal); fp16 cannot hold most of those scales, so it goes through fp32.
    exact = out_dtype in (torch.bfloat16, torch.float32, torch.float64)
    compute_dtype = out_dtype if exact else torch.float32
    step = mx.scales.view(torch.float8_e8m0fnu).to(torch.float32) * 2.0**-FRACTION_BITS  # 255 -> NaN
    q = F.pad(mx.elements, (0, pad)) if pad else mx.elements
    # Convert, then multiply in place: a mixed int8 * float multiply is a much slower kernel.
    values = q.reshape(*lead, nblocks, BLOCK_SIZE).to(compute_dtype)
    values.mul_(step.to(compute_dtype).unsqueeze(-1))
    values = values.reshape(*lead, nblocks * BLOCK_SIZE)
    if pad:
        values = values[..., :last]
    return values.to(out_dtype).contiguous()


def to_bytes(mx: MxTensor) -> bytes:
    """Serialize (header, scales, elements) so a KV chunk fits a protobuf ``bytes`` field."""
    header = _FIXED_HEADER.pack(_MAGIC, _VERSION, _DTYPE_CODES[mx.dtype], len(mx.shape))
    dims = struct.pack(f"<{len(mx.shape)}Q", *mx.shape)
    scales = mx.scales.detach().cpu().contiguous().numpy()
    elements = mx.elements.detach().cpu().contiguous().numpy()
    return b"".join([header, dims, scales.data, elements.data])


def from_bytes(data: bytes | bytearray | memoryview) -> MxTensor:
    """Inverse of ``to_bytes``; the tensors are CPU copies independent of ``data``."""
    view = memoryview(data).cast("B")
    if len(view) < _FIXED_HEADER.size:
        raise ValueError(f"MXINT8 blob too short ({len(view)} bytes)")
    magic, version, code, ndim = _FIXED_HEADER.unpack_from(view)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not an MXINT8 v{_VERSION} blob (magic {magic!r}, version {version})")
    if code not in _CODE_DTYPES:
        raise ValueError(f"unknown dtype code {code}")
    if len(view) < header_nbytes(ndim):
        raise ValueError("MXINT8 blob truncated inside its header")
    shape = struct.unpack_from(f"<{ndim}Q", view, _FIXED_HEADER.size)
    _check_shape(shape)
    if len(view) != encoded_nbytes(shape):
        raise ValueError(f"MXINT8 blob of shape {shape} needs {encoded_nbytes(shape)} bytes, got {len(view)}")
    n_scales = math.prod(scales_shape(shape))
    offset = header_nbytes(ndim)
    scales = np.frombuffer(view, dtype=np.uint8, count=n_scales, offset=offset)
    elements = np.frombuffer(view, dtype=np.int8, count=math.prod(shape), offset=offset + n_scales)
    return MxTensor(
        elements=torch.from_numpy(elements.copy()).reshape(shape),
        scales=torch.from_numpy(scales.copy()).reshape(scales_shape(shape)),
        shape=shape,
        dtype=_CODE_DTYPES[code],
    )


def _power_of_two(biased_exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2^(b - 127) for int32 b in [1, 254], exact in fp32 and bf16."""
    return biased_exponent.bitwise_left_shift(23).view(torch.float32).to(dtype)


def _check_shape(shape: tuple[int, ...]) -> None:
    if len(shape) == 0:
        raise ValueError("MXINT8 blocks run along the last axis; a 0-d tensor has none")
    if any(d < 0 for d in shape):
        raise ValueError(f"invalid shape {shape}")
