"""MXINT8 per the OCP MX v1.0 conversion, in float64, one block at a time.

Written from the spec, not from libs/kvcodec: plain loops, Python's math.frexp for the
exponent and Python's round() (half to even) for the elements. Cleave's documented choices
for what the spec leaves open are spelled out where they apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

BLOCK = 32


@dataclass(frozen=True)
class Reference:
    elements: npt.NDArray[np.int64]  # the input's shape
    scales: npt.NDArray[np.int64]  # E8M0 bytes, shape[:-1] + (blocks,)
    exponents: npt.NDArray[np.float64]  # float64 shared exponent E per block, NaN for NaN-scale blocks
    decoded: npt.NDArray[np.float64]  # float64, the input's shape


def block_exponent(amax: float) -> int:
    """floor(log2(amax)) - emax_elem (0 for MXINT8), clamped to E8M0's [-127, 127]."""
    if amax == 0:
        return -127  # Cleave's choice for all-zero blocks: any scale decodes them to zero
    _, k = math.frexp(amax)  # amax = m * 2**k, 0.5 <= m < 1
    return min(max(k - 1, -127), 127)


def quantize(x: torch.Tensor) -> Reference:
    values = x.detach().to(torch.float64).numpy()  # exact for bf16/fp16/fp32
    shape = values.shape
    last = shape[-1]
    blocks = -(-last // BLOCK)
    rows = values.reshape(-1, last) if values.size else np.zeros((math.prod(shape[:-1]), last))
    elements = np.zeros(rows.shape, dtype=np.int64)
    decoded = np.zeros(rows.shape, dtype=np.float64)
    scales = np.zeros((rows.shape[0], blocks), dtype=np.int64)
    exponents = np.zeros((rows.shape[0], blocks), dtype=np.float64)
    for r in range(rows.shape[0]):
        for b in range(blocks):
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, last)
            block = [float(v) for v in rows[r, lo:hi]]
            if not all(math.isfinite(v) for v in block):
                # Spec: a NaN scale makes the whole block NaN. Cleave treats Inf the same way.
                scales[r, b] = 255
                exponents[r, b] = math.nan
                decoded[r, lo:hi] = math.nan
                continue
            exp = block_exponent(max(abs(v) for v in block))
            scales[r, b] = exp + 127
            exponents[r, b] = exp
            for i, v in enumerate(block):
                q = round(v / 2.0**exp * 64)  # exact scaling in float64; round() is half-even
                q = min(max(q, -127), 127)  # Cleave saturates symmetrically
                elements[r, lo + i] = q
                decoded[r, lo + i] = q * 2.0 ** (exp - 6)
    return Reference(
        elements=elements.reshape(shape),
        scales=scales.reshape((*shape[:-1], blocks)),
        exponents=exponents.reshape((*shape[:-1], blocks)),
        decoded=decoded.reshape(shape),
    )


def per_element(per_block: npt.NDArray[np.float64], last: int) -> npt.NDArray[np.float64]:
    """Broadcasts a per-block array to the elements it covers."""
    return np.repeat(per_block, BLOCK, axis=-1)[..., :last]
