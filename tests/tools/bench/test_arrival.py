from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest

from tools.bench.arrival import inter_arrival_gaps


def gaps(rate: float, burstiness: float, seed: int, n: int = 40_000) -> npt.NDArray[np.float64]:
    return np.fromiter(itertools.islice(inter_arrival_gaps(rate, burstiness, seed), n), dtype=float)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("rate", [0.5, 8.0])
def test_mean_rate_and_burstiness_variance(rate: float, burstiness: float) -> None:
    sample = gaps(rate, burstiness, seed=11)
    # Gamma(shape=B, scale=1/(rate*B)): mean 1/rate, variance 1/(rate² B). With 40k draws the
    # relative standard error of the mean is <= 1% and of the variance <= 3% (B = 0.25).
    assert sample.mean() == pytest.approx(1 / rate, rel=0.04)
    assert sample.var() == pytest.approx(1 / (rate**2 * burstiness), rel=0.12)
    assert (sample > 0).all()


def test_burstier_means_more_variable_at_the_same_rate() -> None:
    cv = [gaps(2.0, b, seed=5).std() / gaps(2.0, b, seed=5).mean() for b in (0.25, 1.0, 4.0)]
    assert cv[0] > cv[1] > cv[2]
    assert cv[1] == pytest.approx(1.0, rel=0.05)  # Poisson: exponential gaps, CV 1


def test_same_seed_same_gaps() -> None:
    assert (gaps(3.0, 1.0, seed=1, n=50) == gaps(3.0, 1.0, seed=1, n=50)).all()
    assert not (gaps(3.0, 1.0, seed=1, n=50) == gaps(3.0, 1.0, seed=2, n=50)).all()


def test_infinite_rate_sends_everything_at_once() -> None:
    assert gaps(math.inf, 1.0, seed=0, n=10).tolist() == [0.0] * 10
