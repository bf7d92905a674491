from __future__ import annotations

import pytest

from libs.planner.slo import Slo, attainment, outcome_of


def test_a_request_meets_the_objectives_by_its_mean_or_its_p99_gap() -> None:
    # TTFT 0.1 s, then 100 gaps of 10 ms but two of 200 ms.
    times = [1.1]
    for i in range(100):
        times.append(times[-1] + (0.2 if i in (10, 60) else 0.01))
    outcome = outcome_of(1.0, times)
    assert outcome.ttft_s == pytest.approx(0.1)
    assert outcome.itl_mean_s == pytest.approx((98 * 0.01 + 0.4) / 100)
    assert outcome.itl_p99_s > 0.1  # the two slow gaps are above the 99th percentile's rank
    assert outcome.output_tokens == 101
    assert outcome.meets(Slo(0.2, 0.02, "mean"))
    assert not outcome.meets(Slo(0.2, 0.02, "p99"))
    assert not outcome.meets(Slo(0.05, 0.02, "mean"))  # TTFT


def test_failed_requests_never_meet_them_and_attainment_counts_requests() -> None:
    slo = Slo(1.0, 1.0)
    good = outcome_of(0.0, [0.1, 0.2])
    failed = outcome_of(0.0, [])
    cut = outcome_of(0.0, [0.1, 0.2], ok=False)
    assert not failed.meets(slo) and not cut.meets(slo)
    assert attainment([good, failed, cut, good], slo) == 0.5
    assert attainment([], slo) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttft_s": 0, "itl_s": 1},
        {"ttft_s": 1, "itl_s": 1, "itl_stat": "p50"},
        {"ttft_s": 1, "itl_s": 1, "attainment": 0},
    ],
)
def test_bad_objectives(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Slo(**kwargs)  # type: ignore[arg-type]
