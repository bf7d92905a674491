from __future__ import annotations

import random

import pytest

from libs.config.errors import ConfigError
from libs.planner.sim.run import poisson_arrivals
from libs.planner.workload import Lengths, RateTrace, Uniform, Workload, parse_lengths


def test_lengths_parse_a_mixture_and_write_it_back() -> None:
    lengths = parse_lengths("--isl", "40:0.5@0.85,1900:0.1@0.15")
    assert [round(w, 2) for w, _ in lengths.components] == [0.85, 0.15]
    assert lengths.components[1][1] == Uniform(1900, 0.1)
    assert parse_lengths("--isl", lengths.text()) == lengths
    assert parse_lengths("--isl", "2000").mean == 2000
    # Weights are normalised.
    assert parse_lengths("--isl", "10@1,20@3").components[1][0] == 0.75


@pytest.mark.parametrize("text", ["", "0", "10:1", "10:-0.1", "10@0", "x", "10:0.5@-1"])
def test_bad_lengths_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--osl: got"):
        parse_lengths("--osl", text)


def test_moments_are_those_of_the_integers_drawn() -> None:
    lengths = Lengths.fixed(100, 0.5)  # uniform on 50..150
    assert lengths.mean == pytest.approx(100)
    assert lengths.moment(2) == pytest.approx(sum(v * v for v in range(50, 151)) / 101)
    assert lengths.high == 150
    rng = random.Random(1)
    draws = [lengths.sample(rng) for _ in range(4000)]
    assert min(draws) == 50 and max(draws) == 150
    assert sum(draws) / len(draws) == pytest.approx(100, rel=0.02)


def test_a_step_trace_and_its_arrivals() -> None:
    trace = RateTrace.step(base=2.0, factor=4.0, start_s=100.0, length_s=50.0)
    assert [trace.rate_at(t) for t in (0, 99.9, 100, 149, 150, 1000)] == [2, 2, 8, 8, 2, 2]
    assert trace.next_change(0) == 100 and trace.next_change(120) == 150 and trace.next_change(150) is None
    assert trace.peak == 8
    times = list(poisson_arrivals(trace, 300.0, random.Random(0)))
    assert times == sorted(times) and times[-1] < 300
    in_step = sum(100 <= t < 150 for t in times)
    outside = len(times) - in_step
    # 400 and 500 expected; Poisson spread is about 20 and 22.
    assert 320 < in_step < 480 and 420 < outside < 580


def test_a_rate_trace_must_start_at_zero_and_go_forward() -> None:
    with pytest.raises(ValueError):
        RateTrace(((1.0, 2.0),))
    with pytest.raises(ValueError):
        RateTrace(((0.0, 2.0), (5.0, 1.0), (4.0, 1.0)))
    assert Workload.simple(2, 100, 10).describe() == "2 req/s, ISL 100, OSL 10"
