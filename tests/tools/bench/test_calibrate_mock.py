"""The calibration fit (tools/bench/calibrate_mock.py): known coefficients come back from the
points they predict, and a coefficient the data would make negative is held at 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libs.mockengine.profiles import PROFILES_DIR, load_profile
from tools.bench.calibrate_mock import FEATURES, fit, predicted, write_profile
from tools.bench.calibrate_served import fit_transfer

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


def test_the_handoff_fit_recovers_latency_and_bandwidth() -> None:
    points = [{"bytes": b, "seconds": 0.05 + b / 2e8} for b in (7e5, 3e6, 1.2e7, 4.6e7)]
    transfer = fit_transfer(points)
    assert transfer["latency_s"] == pytest.approx(0.05, rel=1e-6)
    assert transfer["bandwidth_bytes_per_s"] == pytest.approx(2e8, rel=1e-6)


def test_a_handoff_that_does_not_grow_with_bytes_is_a_latency_alone() -> None:
    points = [{"bytes": b, "seconds": s} for b, s in ((1e6, 0.03), (1e7, 0.02), (4e7, 0.01))]
    assert fit_transfer(points) == {"latency_s": pytest.approx(0.02), "bandwidth_bytes_per_s": 0.0}


def test_a_served_calibration_writes_a_profile_the_mock_loads(tmp_path: Path) -> None:
    source = PROFILES_DIR / "cpu-smollm2.json"
    path = tmp_path / "profile.json"
    path.write_text(source.read_text())
    results = [
        {"cores": cores, "method": "served", "points": grid(TRUE), "coefficients": fit(grid(TRUE))}
        for cores in (1, 2)
    ]
    handoff = {
        "points": [{"length": 32, "seconds": 0.06}, {"length": 512, "seconds": 0.09}],
        "transfer": {"latency_s": 0.05, "bandwidth_bytes_per_s": 4e8},
    }
    cpu = {"model": "a CPU", "flags": ["avx2"], "cores": 2, "kernel": "6"}
    write_profile(path, results, cpu, handoff)

    profile = load_profile(str(path))
    assert profile.kv_transfer.latency_s == 0.05 and profile.kv_transfer.bandwidth_bytes_per_s == 4e8
    assert profile.coefficients_for(1).base_s == pytest.approx(TRUE["base_s"])
    assert "pd stack" in profile.calibration and "32 tokens 60.0 ms" in profile.calibration
