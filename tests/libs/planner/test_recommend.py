from __future__ import annotations

from pathlib import Path

import pytest

from libs.config.roles import Role
from libs.planner.capacity import Capacity, Engine, Shape
from libs.planner.recommend import local_prefill_threshold, model_counts, refine
from libs.planner.sim.run import SimResult
from libs.planner.slo import Outcome, Slo
from libs.planner.state import Counts
from tests.libs.planner.helpers import write_profile

SLO = Slo(1.0, 0.1)


def test_model_counts_divide_the_rate_by_each_roles_capacity() -> None:
    disagg, coloc = model_counts(10.0, Capacity(prefill=4.0, decode=6.0, colocated=3.0), utilization=0.5)
    assert disagg == Counts(prefill=5, decode=4)
    assert coloc == Counts(colocated=7)


def test_the_local_prefill_threshold_fits_a_prompt_in_the_itl_slack(tmp_path: Path) -> None:
    engine = Engine.from_profile(write_profile(tmp_path))
    shape = Shape.of_means(100, 100)
    # ITL 30 ms: the decode batch's step leaves some slack; each prompt token costs 0.1 ms.
    threshold = local_prefill_threshold(engine, shape, Slo(1.0, 0.03))
    assert 0 < threshold < 200
    assert local_prefill_threshold(engine, shape, Slo(1.0, 0.05)) > threshold
    # No slack at all: a step alone (10 ms + 1 ms) exceeds it.
    assert local_prefill_threshold(engine, shape, Slo(1.0, 0.005)) == 0


def fake_run(needs: Counts) -> object:
    """A simulation in which a fleet meets the objectives once every role has what `needs` says;
    a short decode role misses ITL, a short prefill role TTFT (and is the busier)."""

    def run(fleet: Counts) -> SimResult:
        short_prefill = fleet.prefill < needs.prefill
        short_decode = fleet.decode < needs.decode
        short_colocated = fleet.colocated < needs.colocated
        ok = Outcome(0.0, 0.1, 0.01, 0.01, 10)
        slow_first = Outcome(0.0, 5.0, 0.01, 0.01, 10)
        slow_tokens = Outcome(0.0, 0.1, 1.0, 1.0, 10)
        outcome = slow_tokens if short_decode else slow_first if (short_prefill or short_colocated) else ok
        busy = {Role.PREFILL: 0.9 if short_prefill else 0.3, Role.DECODE: 0.5, Role.BOTH: 0.5}
        return SimResult(
            fleet.name,
            [outcome] * 10,
            0.0,
            10.0,
            busy_s={r: b * 10 * max(fleet.get(r), 1) for r, b in busy.items()},
        )

    return run


@pytest.mark.parametrize("start", [Counts(1, 1), Counts(6, 6), Counts(3, 1)])
def test_refine_finds_the_smallest_fleet_that_meets_the_objectives(start: Counts) -> None:
    log: list[object] = []
    found = refine(start, fake_run(Counts(3, 2)), SLO, 10.0, limit=20, log=log)  # type: ignore[arg-type]
    assert found == Counts(3, 2)


def test_refine_stops_at_the_limit() -> None:
    found = refine(Counts(colocated=1), fake_run(Counts(colocated=50)), SLO, 10.0, limit=4, log=[])  # type: ignore[arg-type]
    assert found == Counts(colocated=4)
