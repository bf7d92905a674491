from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
import torch

from libs.kvcodec.mxint8 import MxTensor, decode, encode
from tests.libs.kvcodec.reference import Reference, per_element, quantize

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NAN = math.nan
INF = math.inf


def sample(kind: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        values = rng.standard_normal(shape)
    elif kind == "uniform":
        values = rng.uniform(-3.0, 3.0, shape)
    elif kind == "student_t":  # heavy tails: a few huge values per block dominate the scale
        values = rng.standard_t(2.0, shape) * 4.0
    elif kind == "kv_like":  # log-normal channel magnitudes plus outlier channels, like RoPE'd keys
        channel = np.exp(0.75 * rng.standard_normal(shape[-1]))
        channel[rng.integers(0, shape[-1], 3)] *= 20.0
        values = rng.standard_normal(shape) * channel
    elif kind == "wide":  # every row at its own power of two, across the dtype's range
        top = math.log2(torch.finfo(dtype).max) - 4
        bottom = math.log2(torch.finfo(dtype).tiny) + 4
        values = rng.standard_normal(shape) * 2.0 ** rng.uniform(bottom, top, (*shape[:-1], 1))
    else:
        raise AssertionError(kind)
    return torch.from_numpy(values).to(dtype)


def block_max(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    starts = range(0, values.shape[-1], 32)
    return np.stack([values[..., i : i + 32].max(axis=-1) for i in starts], axis=-1)


def assert_matches_reference(x: torch.Tensor, ref: Reference) -> MxTensor:
    mx = encode(x)
    np.testing.assert_array_equal(mx.elements.numpy(), ref.elements)
    np.testing.assert_array_equal(mx.scales.numpy(), ref.scales)
    np.testing.assert_array_equal(decode(mx, torch.float64).numpy(), ref.decoded)
    expected = torch.from_numpy(ref.decoded).to(x.dtype)
    assert torch.equal(decode(mx).isnan(), expected.isnan())
    assert torch.equal(decode(mx).nan_to_num(), expected.nan_to_num())
    return mx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "uniform", "student_t", "kv_like", "wide"])
def test_matches_the_float64_reference(kind: str, dtype: torch.dtype) -> None:
    x = sample(kind, (3, 5, 96), dtype)
    assert_matches_reference(x, quantize(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "uniform", "student_t", "kv_like", "wide"])
def test_error_is_within_half_an_lsb_unless_saturated(kind: str, dtype: torch.dtype) -> None:
    x = sample(kind, (4, 8, 80), dtype, seed=1)
    x64 = x.to(torch.float64).numpy()
    decoded = decode(encode(x), torch.float64).numpy()
    ref = quantize(x)
    exp = per_element(ref.exponents, x.shape[-1])
    lsb = 2.0 ** (exp - 6)
    err = np.abs(decoded - x64)
    saturated = np.abs(x64) / lsb > 127.5
    assert np.all(err[~saturated] <= lsb[~saturated] / 2)
    assert np.all(err[saturated] < lsb[saturated])
    # Relative to the block's largest magnitude (E not clamped here): at most 2^-7.
    block_amax = per_element(block_max(np.abs(x64)), x.shape[-1])
    assert np.all(err <= block_amax / 128)
    # Values at least half their block's largest magnitude keep 2^-6 relative precision.
    large = np.abs(x64) >= block_amax / 2
    assert np.all(err[large] <= np.abs(x64[large]) / 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exactly_representable_values_round_trip_exactly(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(2)
    rows, blocks = 64, 3
    # Widest exponent range whose q * 2^(E-6) values the dtype holds exactly.
    low, high = (-18, 15) if dtype == torch.float16 else (-127, 127)
    exps = rng.integers(low, high + 1, (rows, blocks))
    q = rng.integers(-127, 128, (rows, blocks, 32))
    # One value per block with |q| in [64, 127] pins the block exponent to E.
    q[..., 0] = rng.integers(64, 128, (rows, blocks)) * rng.choice([-1, 1], (rows, blocks))
    values = q * np.exp2(exps[..., None] - 6.0)
    x = torch.from_numpy(values.reshape(rows, blocks * 32)).to(dtype)
    assert np.array_equal(x.to(torch.float64).numpy(), values.reshape(rows, -1))
    mx = encode(x)
    assert torch.equal(decode(mx), x)
    np.testing.assert_array_equal(mx.elements.numpy().reshape(q.shape), q)
    np.testing.assert_array_equal(mx.scales.numpy(), exps + 127)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_blocks_decode_to_exact_zeros(dtype: torch.dtype) -> None:
    x = torch.zeros(3, 96, dtype=dtype)
    x[0, :32] = -0.0
    x[1, 32:64] = torch.linspace(-1, 1, 32, dtype=dtype)
    mx = encode(x)
    assert mx.scales[0].tolist() == [0, 0, 0] and mx.scales[2].tolist() == [0, 0, 0]
    assert mx.scales[1].tolist() == [0, 127, 0]
    out = decode(mx)
    assert torch.equal(out[[0, 2]], torch.zeros(2, 96, dtype=dtype))
    assert not out[0].signbit().any()  # documented: -0.0 decodes as +0.0
    assert torch.equal(out[1, :32], torch.zeros(32, dtype=dtype))
    assert torch.equal(out[1, 64:], torch.zeros(32, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("poison", [NAN, INF, -INF])
def test_nan_and_inf_poison_only_their_block(dtype: torch.dtype, poison: float) -> None:
    x = sample("normal", (2, 100), dtype, seed=3)
    x[0, 40] = poison
    x[1, 98] = poison  # in the partial last block
    mx = assert_matches_reference(x, quantize(x))
    assert mx.scales[0].tolist()[1] == 255 and mx.scales[1].tolist()[3] == 255
    assert (mx.scales == 255).sum().item() == 2
    assert not mx.elements[0, 32:64].any() and not mx.elements[1, 96:].any()
    out = decode(mx)
    assert out[0, 32:64].isnan().all() and out[1, 96:].isnan().all()
    assert out.isnan().sum().item() == 32 + 4
    assert not out.isinf().any()  # documented: Inf does not survive, it poisons the block


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiny_and_subnormal_values_use_the_clamped_exponent(dtype: torch.dtype) -> None:
    tiny = torch.finfo(dtype).tiny  # 2^-126, smallest normal
    values = [2.0**-149, 2.0**-133, 3 * 2.0**-135, 2.0**-130, -(2.0**-128), 1.5 * 2.0**-127, 0.0]
    x = torch.tensor(values * 4 + [0.0] * 4, dtype=torch.float64).to(dtype).reshape(1, 32)
    assert x.abs().max().item() < tiny
    mx = assert_matches_reference(x, quantize(x))
    assert mx.scales.tolist() == [[0]]  # floor(log2) is below -127: clamped to 2^-127
    err = (decode(mx, torch.float64) - x.to(torch.float64)).abs()
    assert err.max().item() <= 2.0**-134  # half an LSB of the clamped scale
    assert decode(mx)[0, 3].item() == 2.0**-130  # 8 LSBs of 2^-133: exact
    # The smallest normal sits exactly at E = -126.
    at_tiny = encode(torch.full((32,), tiny, dtype=dtype))
    assert at_tiny.scales.tolist() == [1] and decode(at_tiny)[0].item() == tiny


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_at_the_dtype_maximum_saturate_to_finite_values(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max
    x = torch.tensor([big, -big, big / 3, 1.0] + [0.0] * 28, dtype=dtype)
    mx = assert_matches_reference(x, quantize(x))
    exp = math.frexp(big)[1] - 1
    assert mx.scales.tolist() == [exp + 127]
    assert mx.elements[:2].tolist() == [127, -127]  # symmetric: never -128
    out = decode(mx)
    assert out.isfinite().all()
    assert out[0].item() == 127 * 2.0 ** (exp - 6) and out[1].item() == -out[0].item()
    assert out[3].item() == 0.0  # 1.0 is far below one LSB of this block


def test_rounding_is_half_to_even_and_saturation_symmetric() -> None:
    lsb = 1 / 64
    halves = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 125.5, 126.5, -126.5, 127.5, -127.5, 127.9]
    x = torch.tensor([1.0, *(h * lsb for h in halves)] + [0.0] * 19, dtype=torch.float32)
    mx = encode(x)
    assert mx.scales.tolist() == [127]  # E = 0: the block max is below 2
    assert mx.elements[:13].tolist() == [64, 0, 2, 2, 0, -2, -2, 126, 126, -126, 127, -127, 127]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(1,), (31,), (32,), (33,), (65,), (2, 3, 64), (4, 100), (3, 1, 7), (0,), (0, 64), (5, 0), (2, 0, 3)],
)
def test_shapes_and_dtypes_round_trip(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = sample("normal", shape, dtype, seed=4)
    mx = encode(x)
    assert mx.shape == shape and mx.dtype == dtype
    assert mx.elements.shape == shape and mx.elements.dtype == torch.int8
    assert mx.scales.shape == (*shape[:-1], math.ceil(shape[-1] / 32)) and mx.scales.dtype == torch.uint8
    out = decode(mx)
    assert out.shape == shape and out.dtype == dtype and out.is_contiguous()
    as_fp32 = decode(mx, torch.float32)
    assert as_fp32.dtype == torch.float32 and torch.equal(as_fp32.to(dtype), out)
    if x.numel():
        assert_matches_reference(x, quantize(x))


def test_non_contiguous_input_encodes_like_its_contiguous_copy() -> None:
    x = sample("kv_like", (64, 40), torch.bfloat16).t()
    assert not x.is_contiguous()
    a, b = encode(x), encode(x.contiguous())
    assert torch.equal(a.elements, b.elements) and torch.equal(a.scales, b.scales)


def test_encode_does_not_track_gradients_or_modify_its_input() -> None:
    x = torch.randn(4, 64, requires_grad=True)
    before = x.detach().clone()
    mx = encode(x)
    assert not mx.elements.requires_grad
    assert torch.equal(x.detach(), before)


def test_unsupported_inputs_are_rejected() -> None:
    with pytest.raises(TypeError, match="encodes"):
        encode(torch.zeros(32, dtype=torch.float64))
    with pytest.raises(TypeError, match="encodes"):
        encode(torch.zeros(32, dtype=torch.int32))
    with pytest.raises(ValueError, match="0-d"):
        encode(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        decode(encode(torch.zeros(32)), torch.int8)


def test_mx_tensor_rejects_inconsistent_parts() -> None:
    mx = encode(torch.zeros(2, 40))
    with pytest.raises(ValueError, match="scales shape"):
        MxTensor(elements=mx.elements, scales=mx.scales[:, :1], shape=(2, 40), dtype=torch.float32)
    with pytest.raises(ValueError, match="elements shape"):
        MxTensor(elements=mx.elements[:, :32], scales=mx.scales, shape=(2, 40), dtype=torch.float32)
    with pytest.raises(ValueError, match="int8"):
        MxTensor(elements=mx.elements.to(torch.uint8), scales=mx.scales, shape=(2, 40), dtype=torch.float32)
