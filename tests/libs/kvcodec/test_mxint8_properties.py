"""Hypothesis properties of the codec, checked against the spec's bounds and the reference."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from libs.kvcodec.mxint8 import decode, encode, from_bytes, to_bytes
from tests.libs.kvcodec.reference import per_element, quantize

# No example database: Bazel's sandbox is read-only and runs must not depend on earlier ones.
PROPERTY = settings(max_examples=150, deadline=None, database=None)
SHAPES = array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40)
BF16_MAX = torch.finfo(torch.bfloat16).max


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Finite bf16/fp16/fp32 tensors, subnormals and extreme magnitudes included."""
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    width: Literal[16, 32] = 16 if dtype == torch.float16 else 32
    numpy_dtype = np.float16 if width == 16 else np.float32
    values = draw(
        arrays(numpy_dtype, SHAPES, elements=st.floats(width=width, allow_nan=False, allow_infinity=False))
    )
    t = torch.from_numpy(values)
    if dtype == torch.bfloat16:  # fp32 values beyond bf16's max would round to Inf
        t = t.clamp(-BF16_MAX, BF16_MAX)
    return t.to(dtype)


@PROPERTY
@given(tensors())
def test_error_is_within_the_spec_bound_and_matches_the_reference(x: torch.Tensor) -> None:
    ref = quantize(x)
    mx = encode(x)
    np.testing.assert_array_equal(mx.scales.numpy(), ref.scales)
    np.testing.assert_array_equal(mx.elements.numpy(), ref.elements)
    decoded = decode(mx, torch.float64).numpy()
    x64 = x.to(torch.float64).numpy()
    lsb = 2.0 ** (per_element(ref.exponents, x.shape[-1]) - 6)
    err = np.abs(decoded - x64)
    saturated = np.abs(x64) / lsb > 127.5
    assert np.all(err[~saturated] <= lsb[~saturated] / 2)
    assert np.all(err[saturated] < lsb[saturated])
    assert torch.equal(decode(mx), torch.from_numpy(ref.decoded).to(x.dtype))


@PROPERTY
@given(tensors())
def test_decoded_values_are_fixed_points(x: torch.Tensor) -> None:
    once = encode(x)
    twice = encode(decode(once))
    assert torch.equal(twice.elements, once.elements) and torch.equal(twice.scales, once.scales)
    assert torch.equal(decode(twice), decode(once))


@PROPERTY
@given(tensors())
def test_negation_commutes_with_encoding(x: torch.Tensor) -> None:
    a, b = encode(x), encode(-x)
    assert torch.equal(b.elements, -a.elements) and torch.equal(b.scales, a.scales)


@PROPERTY
@given(tensors())
def test_bytes_round_trip(x: torch.Tensor) -> None:
    mx = encode(x)
    back = from_bytes(to_bytes(mx))
    assert (back.shape, back.dtype) == (mx.shape, mx.dtype)
    assert torch.equal(back.elements, mx.elements) and torch.equal(back.scales, mx.scales)
