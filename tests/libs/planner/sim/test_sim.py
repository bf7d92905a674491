"""The simulation on a small profile (tests/libs/planner/helpers.py): what it must keep of the
mock engine and the gateway. Each run is a few simulated seconds (well under a second here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.config.roles import Role
from libs.planner.sim.run import SimOptions, simulate
from libs.planner.slo import Slo, attainment, goodput
from libs.planner.state import Counts, Observation
from libs.planner.workload import Lengths, RateTrace, Workload
from tests.libs.planner.helpers import write_profile


@pytest.fixture
def profile(tmp_path: Path) -> str:
    return write_profile(tmp_path)


def test_every_request_gets_all_its_tokens_on_either_kind_of_fleet(profile: str) -> None:
    workload = Workload.simple(5.0, 100, 20, spread=0.5)
    for fleet in (Counts(colocated=2), Counts(1, 1)):
        result = simulate(fleet, workload, SimOptions(profile, duration_s=10.0, seed=3))
        assert result.unfinished == 0 and len(result.outcomes) > 20
        assert all(o.ok and 10 <= o.output_tokens <= 30 for o in result.outcomes)
        # The same arrivals and lengths for the same seed, whatever the fleet.
        assert sorted(o.output_tokens for o in result.outcomes) == sorted(
            o.output_tokens
            for o in simulate(Counts(colocated=1), workload, SimOptions(profile, 10.0, seed=3)).outcomes
        )


def test_one_request_alone_takes_the_profiles_step_times(profile: str) -> None:
    workload = Workload(RateTrace.constant(0.0), Lengths.fixed(100), Lengths.fixed(5))
    options = SimOptions(profile, duration_s=5.0, arrivals=(1.0,))
    (alone,) = simulate(Counts(colocated=1), workload, options).outcomes
    # First step: the 100-token prompt (10 ms + 1 ms + 100 * 0.1 ms); then 1 token a step (11 ms).
    assert alone.ttft_s == pytest.approx(0.021, abs=1e-9)
    assert alone.itl_mean_s == pytest.approx(0.011, abs=1e-9)
    (first,) = simulate(Counts(1, 1), workload, options).outcomes
    # Prefill (21 ms) + the 2 ms transfer + decode's step computing the last prompt token (11.1 ms).
    assert first.ttft_s == pytest.approx(0.021 + 0.002 + 0.0111, abs=1e-9)


def test_disaggregation_keeps_long_prompts_out_of_decode_steps(profile: str) -> None:
    # 250-token prompts: 36 ms steps for everyone decoding beside them when colocated.
    workload = Workload.simple(4.0, 250, 60)
    slo = Slo(1.0, 0.02, "p99")
    colocated = simulate(Counts(colocated=2), workload, SimOptions(profile, duration_s=20.0, warmup_s=2.0))
    disaggregated = simulate(Counts(1, 1), workload, SimOptions(profile, duration_s=20.0, warmup_s=2.0))
    assert attainment(disaggregated.outcomes, slo) > 0.9 > attainment(colocated.outcomes, slo)


class StepController:
    """Asks for `after` once the simulated clock passes `at`."""

    interval_s = 1.0
    quantile = 0.9

    def __init__(self, before: Counts, after: Counts, at: float) -> None:
        self.before, self.after, self.at = before, after, at
        self.seen: list[Observation] = []

    def decide(self, observation: Observation, current: Counts) -> Counts:
        self.seen.append(observation)
        return self.after if observation.now >= self.at else self.before


def test_removed_workers_drain_and_added_ones_serve_after_their_start_up(profile: str) -> None:
    workload = Workload.simple(8.0, 50, 40)
    controller = StepController(Counts(3, 3), Counts(1, 1), at=6.0)
    result = simulate(
        Counts(3, 3), workload, SimOptions(profile, duration_s=12.0, seed=2), controller=controller
    )
    assert result.unfinished == 0 and all(o.ok and o.output_tokens == 40 for o in result.outcomes)
    final = result.timeline[-1]
    assert final.ready == Counts(1, 1) and final.retiring == Counts()
    # Observations report the arrival rate and the roles' engines.
    assert 5 < sum(o.arrival_rate for o in controller.seen) / len(controller.seen) < 11
    assert controller.seen[2].role(Role.DECODE).ready == 3

    grow = StepController(Counts(1, 1), Counts(1, 2), at=2.0)
    grown = simulate(
        Counts(1, 1), workload, SimOptions(profile, duration_s=12.0, startup_s=5.0), controller=grow
    )
    starts = [(p.t, p.starting.decode, p.ready.decode) for p in grown.timeline]
    assert any(starting == 1 and ready == 1 for _, starting, ready in starts)
    ready_at = min(t for t, _, ready in starts if ready == 2)
    assert 7.0 <= ready_at <= 8.0  # asked at t=2 (the tick at 2 s), ready 5 s later, seen at the next tick
    # Worker-seconds: 2 from 0 to the end, the third from t=2.
    assert grown.worker_seconds == pytest.approx(2 * grown.end_s + (grown.end_s - 2.0), abs=1.0)


def test_a_closed_loop_keeps_its_concurrency_and_sends_all_its_requests(profile: str) -> None:
    workload = Workload.simple(0.0, 50, 10)
    options = SimOptions(profile, duration_s=1e9, concurrency=2, num_requests=7)
    outcomes = sorted(simulate(Counts(colocated=1), workload, options).outcomes, key=lambda o: o.arrival_s)
    assert len(outcomes) == 7 and all(o.ok for o in outcomes)
    # Never more than 2 in flight: each arrival after the first two is some earlier one's end.
    for index, outcome in enumerate(outcomes):
        in_flight = sum(o.arrival_s <= outcome.arrival_s < o.end_s for o in outcomes[:index])
        assert in_flight <= 1
    assert outcomes[2].arrival_s == pytest.approx(min(o.end_s for o in outcomes[:2]))
    slo = Slo(10.0, 10.0)
    span = max(o.end_s for o in outcomes) - outcomes[0].arrival_s
    assert goodput(outcomes, slo) == pytest.approx(7 / span)
