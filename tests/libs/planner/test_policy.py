from __future__ import annotations

import math
from pathlib import Path

import pytest

from libs.config.roles import Role
from libs.planner.capacity import Engine, Shape, capacity
from libs.planner.policy import Policy, PolicyConfig
from libs.planner.slo import Slo
from libs.planner.state import Counts, Observation, RoleLoad
from tests.libs.planner.helpers import write_profile

SLO = Slo(0.5, 0.05)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine.from_profile(write_profile(tmp_path))


def policy(engine: Engine, **changes: object) -> Policy:
    settings: dict[str, object] = {
        "slo": SLO,
        "minimum": Counts(1, 1),
        "maximum": Counts(20, 20),
        "startup_s": 30.0,
        "interval_s": 10.0,
        "down_delay_s": 60.0,
    }
    settings.update(changes)
    return Policy(PolicyConfig(**settings), engine)  # type: ignore[arg-type]


def seen(now: float, rate: float, **fields: object) -> Observation:
    values: dict[str, object] = {"isl_mean": 100.0, "osl_mean": 100.0}
    values.update(fields)
    return Observation(now=now, window_s=10.0, arrival_rate=rate, **values)  # type: ignore[arg-type]


def per_worker(engine: Engine) -> tuple[float, float]:
    caps = capacity(engine, Shape.of_means(100, 100), SLO)
    return caps.prefill, caps.decode


def test_it_scales_up_at_once_to_what_the_model_needs(engine: Engine) -> None:
    prefill, decode = per_worker(engine)
    rate = 4 * decode
    target = policy(engine).decide(seen(10, rate), Counts(1, 1))
    assert target == Counts(math.ceil(rate / (prefill * 0.85)), math.ceil(rate / (decode * 0.85)))


def test_it_scales_down_only_after_the_delay_and_one_worker_a_step(engine: Engine) -> None:
    p = policy(engine)
    fleet = Counts(1, 6)
    low = 0.5 * per_worker(engine)[1]  # one decode worker is plenty
    targets = []
    for tick in range(1, 16):
        fleet = p.decide(seen(10.0 * tick, low), fleet)
        targets.append(fleet.decode)
    # 60 s below before the first step down, then one a minute.
    assert targets[:6] == [6] * 6
    assert targets[6] == 5 and targets[7:12] == [5] * 5 and targets[12] == 4


def test_the_hysteresis_band_keeps_a_fleet_that_is_enough_but_not_too_much(engine: Engine) -> None:
    decode = per_worker(engine)[1]
    p = policy(engine)
    # 3 workers needed at 85%, 4 at 60%: keep 4 forever.
    rate = 2.0 * decode
    fleet = Counts(1, 4)
    for tick in range(1, 30):
        fleet = p.decide(seen(10.0 * tick, rate), fleet)
    assert fleet.decode == 4


def test_counts_stay_within_min_and_max(engine: Engine) -> None:
    p = policy(engine, minimum=Counts(2, 2), maximum=Counts(3, 3))
    assert p.decide(seen(10, 1000.0), Counts(2, 2)) == Counts(3, 3)
    idle = Counts(3, 3)
    for tick in range(2, 40):
        idle = p.decide(seen(10.0 * tick, 0.0), idle)
    assert idle == Counts(2, 2)


def test_a_backlog_is_worked_off_within_drain_s(engine: Engine) -> None:
    decode = per_worker(engine)[1]
    p = policy(engine, drain_s=10.0)
    waiting = {Role.DECODE: RoleLoad(ready=1, waiting=math.floor(10 * decode * 0.85 * 3))}
    target = p.decide(seen(10, 0.0, roles=waiting), Counts(1, 1))
    assert target.decode == 3


def test_a_missed_objective_adds_a_worker_unless_one_is_starting(engine: Engine) -> None:
    p = policy(engine)
    light = 0.1
    missed = {"ttft_q": 2.0, "itl_q": 0.2}
    assert p.decide(seen(10, light, **missed), Counts(1, 1)) == Counts(2, 2)
    starting = {Role.PREFILL: RoleLoad(ready=1, starting=1), Role.DECODE: RoleLoad(ready=1)}
    assert p.decide(seen(20, light, roles=starting, **missed), Counts(2, 1)) == Counts(2, 2)
    assert policy(engine, feedback=False).decide(seen(10, light, **missed), Counts(1, 1)) == Counts(1, 1)


def test_a_colocated_fleet_is_sized_as_colocated(engine: Engine) -> None:
    colocated = capacity(engine, Shape.of_means(100, 100), SLO).colocated
    p = policy(engine, minimum=Counts(colocated=1), maximum=Counts(colocated=10))
    target = p.decide(seen(10, 3 * colocated), Counts(colocated=1))
    assert target == Counts(colocated=math.ceil(3 / 0.85))


def test_the_forecast_follows_a_ramp_but_not_a_step_beyond_half_again(engine: Engine) -> None:
    p = policy(engine, startup_s=60.0)
    for tick, rate in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
        forecast = p.forecast(10.0 * tick, rate)
    assert forecast == pytest.approx(4.0 * 1.5)  # +0.1/s over 60 s would be 10, capped
    q = policy(engine, startup_s=5.0)
    for tick, rate in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
        forecast = q.forecast(10.0 * tick, rate)
    assert forecast == pytest.approx(4.5)  # the ramp's 0.1/s over 5 s
