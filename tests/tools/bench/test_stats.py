from __future__ import annotations

import numpy as np
import pytest

from tools.bench.config import Slos
from tools.bench.records import RequestRecord
from tools.bench.stats import distribution, meets_slos, summarize, tpot_s


def record(
    request_id: int = 0,
    *,
    ttft: float | None = 0.1,
    e2e: float | None = 1.0,
    out: int = 10,
    itl: tuple[float, ...] = (),
    ok: bool = True,
    error: str | None = None,
    prompt_tokens: int | None = None,
    input_len: int = 50,
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session_id=request_id,
        turn=0,
        start_s=float(request_id),
        input_len=input_len,
        max_tokens=out,
        ok=ok,
        error=error,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=itl,
        output_tokens=out,
        prompt_tokens=prompt_tokens,
    )


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    assert tpot_s(record(ttft=0.2, e2e=2.2, out=11)) == pytest.approx(0.2)
    assert tpot_s(record(ttft=0.2, e2e=0.5, out=2)) == pytest.approx(0.3)
    assert tpot_s(record(out=1)) is None
    assert tpot_s(record(ttft=None)) is None


def test_distribution_percentiles_in_ms() -> None:
    dist = distribution(np.arange(1, 102) / 1000)  # 1..101 ms
    assert dist is not None
    assert (dist.count, dist.mean, dist.p50, dist.p90, dist.p99) == pytest.approx((101, 51, 51, 91, 100))
    skewed = distribution([0.001] * 9 + [1.0])
    assert skewed is not None and skewed.p50 == pytest.approx(1.0) and skewed.mean == pytest.approx(100.9)
    assert distribution([]) is None


def test_summary_counts_only_successful_requests_in_throughput() -> None:
    records = [
        record(0, out=10, prompt_tokens=20, itl=(0.1, 0.3)),
        record(1, out=30, prompt_tokens=None, input_len=40, itl=(0.2,)),
        record(2, ok=False, error="HTTP 500: boom", ttft=None, e2e=0.5, out=0),
        record(3, ok=False, error="HTTP 500: boom", ttft=None, e2e=0.5, out=0),
        record(4, ok=False, error="ReadTimeout", ttft=None, e2e=9.0, out=0),
    ]
    summary = summarize(records, duration_s=4.0, slos=Slos())
    assert (summary.requests, summary.completed, summary.errors) == (5, 2, 3)
    assert summary.error_messages == ("HTTP 500: boom", "ReadTimeout")
    assert summary.output_tokens == 40
    assert summary.input_tokens == 60  # 20 reported + 40 estimated where no usage came back
    assert summary.request_throughput == pytest.approx(0.5)
    assert summary.output_throughput == pytest.approx(10.0)
    assert summary.total_token_throughput == pytest.approx(25.0)
    assert summary.goodput is None
    assert (
        summary.itl_ms is not None and summary.itl_ms.count == 3 and summary.itl_ms.mean == pytest.approx(200)
    )
    assert summary.e2e_ms is not None and summary.e2e_ms.count == 2  # failures are not latencies
    # TPOT per request: 0.9 / 9 and 0.9 / 29.
    assert summary.tpot_ms is not None and summary.tpot_ms.mean == pytest.approx((100 + 900 / 29) / 2)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    slos = Slos(ttft_ms=200, tpot_ms=50)
    fast = record(0, ttft=0.1, e2e=0.5, out=11)  # TPOT 40 ms
    slow_start = record(1, ttft=0.3, e2e=0.7, out=11)  # TTFT misses
    slow_decode = record(2, ttft=0.1, e2e=1.1, out=11)  # TPOT 100 ms misses
    one_token = record(3, ttft=0.15, e2e=0.15, out=1)  # no TPOT to miss
    failed = record(4, ok=False, error="x", ttft=0.01, e2e=0.02, out=0)
    assert [meets_slos(r, slos) for r in (fast, slow_start, slow_decode, one_token, failed)] == [
        True,
        False,
        False,
        True,
        False,
    ]
    summary = summarize([fast, slow_start, slow_decode, one_token, failed], duration_s=2.0, slos=slos)
    assert summary.goodput == pytest.approx(1.0)
    assert meets_slos(slow_decode, Slos(e2e_ms=1100)) and not meets_slos(slow_decode, Slos(e2e_ms=1000))


def test_empty_run_summarizes_to_zeros() -> None:
    summary = summarize([], duration_s=0.0, slos=Slos(ttft_ms=1))
    assert (summary.requests, summary.request_throughput, summary.goodput) == (0, 0.0, 0.0)
    assert summary.ttft_ms is None and summary.itl_ms is None
