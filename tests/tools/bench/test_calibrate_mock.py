"""The calibration fit (tools/bench/calibrate_mock.py): known coefficients come back from the
points they predict, and a coefficient the data would make negative is held at 0."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench.calibrate_mock import FEATURES, fit, predicted

TRUE = {
    "base_s": 0.018,
    "per_seq_s": 0.001,
    "per_prefill_token_s": 0.0006,
    "per_context_token_s": 2e-7,
    "per_prefill_attention_s": 1e-9,
}


def point(shape: list[float], coefficients: dict[str, float]) -> dict[str, Any]:
    return {"shape": shape, "seconds": predicted(coefficients, shape)}


def grid(coefficients: dict[str, float]) -> list[dict[str, Any]]:
    decode = [[1.0, b, 0.0, b * (c + 12.0), 0.0] for b in (1, 2, 4, 8, 16) for c in (64, 512, 1536)]
    prefill = [[1.0, 1.0, n, 0.0, n * n / 2] for n in (32, 128, 512, 1024, 2000)]
    return [point(shape, coefficients) for shape in decode + prefill]


def test_the_fit_recovers_the_coefficients_that_made_the_points() -> None:
    fitted = fit(grid(TRUE))
    for name in FEATURES:
        assert fitted[name] == pytest.approx(TRUE[name], rel=1e-6, abs=1e-12)


def test_a_coefficient_the_data_makes_negative_is_held_at_zero() -> None:
    points = grid({**TRUE, "per_context_token_s": 0.0})
    for p in points:  # decode steps a little faster the longer their context: noise, not physics
        shape = p["shape"]
        p["seconds"] = p["seconds"] - 1e-8 * shape[3]
    fitted = fit(points)
    assert fitted["per_context_token_s"] == 0.0
    assert all(value >= 0 for value in fitted.values())
