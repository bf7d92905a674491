"""Interleaved rounds of tools/bench:compare (no model): the rotated order, the statistics over
rounds (ratios within a round, then median and spread), goodput at SLO pairs, CPU per token,
the rounds report, and the rate sweep's medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench.records import RequestRecord
from tools.bench.stats import Distribution, Summary
from tools.bench.systems import rounds_report, sweep
from tools.bench.systems.catalog import ServingSettings
from tools.bench.systems.rounds import (
    SloPair,
    cpu_ms_per_token,
    cpu_spreads,
    goodput,
    metric_spreads,
    parse_slo_pair,
    ratio_spreads,
    request_itl_p99_ms,
    round_orders,
    spread,
)
from tools.bench.systems.tables import SystemOutcome


def dist(p50: float) -> Distribution:
    return Distribution(count=10, mean=p50, p50=p50, p90=p50, p99=p50 * 2)


def summary(tok_s: float, ttft: float = 100.0, output_tokens: int = 1000) -> Summary:
    return Summary(
        duration_s=10.0, requests=10, completed=10, errors=0, error_messages=(), input_tokens=400,
        output_tokens=output_tokens, request_throughput=1.0, output_throughput=tok_s,
        total_token_throughput=tok_s + 40.0, goodput=None, ttft_ms=dist(ttft), tpot_ms=dist(20.0),
        itl_ms=dist(20.0), e2e_ms=dist(ttft + 300),
    )  # fmt: skip


def outcome(system: str, tok_s: float, **kwargs: object) -> SystemOutcome:
    return SystemOutcome(system, system, summary(tok_s), **kwargs)  # type: ignore[arg-type]


def record(ttft_s: float | None, gaps: tuple[float, ...], ok: bool = True) -> RequestRecord:
    return RequestRecord(0, 0, 0, 0.0, 10, 10, ok, ttft_s=ttft_s, e2e_s=1.0, itl_s=gaps, output_tokens=10)


def test_each_round_rotates_the_order_so_every_system_takes_every_position() -> None:
    orders = round_orders(["a", "b", "c"], 3)
    assert orders == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]
    for position in range(3):
        assert {order[position] for order in orders} == {"a", "b", "c"}
    assert round_orders(["a", "b"], 1) == [("a", "b")]
    assert round_orders(["a", "b"], 4)[2:] == [("a", "b"), ("b", "a")]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        round_orders(["a"], 0)


def test_spread_is_median_and_min_max_of_finite_values() -> None:
    s = spread([3.0, None, 1.0, float("nan"), 2.0, 10.0])
    assert s is not None and (s.median, s.low, s.high, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.cell(1) == "2.5 [1.0–10.0]"
    one = spread([0.5])
    assert one is not None and one.cell() == "0.50 (1 round)"
    assert spread([None, float("inf")]) is None


def test_ratios_are_taken_within_each_round_then_summarized() -> None:
    # Round 2 is slow for everyone (a busy machine): the ratio, taken within the round, holds.
    rounds = [
        [outcome("vllm", 100.0), outcome("cleave-pd", 90.0)],
        [outcome("vllm", 50.0), outcome("cleave-pd", 50.0)],
        [outcome("vllm", 100.0), outcome("cleave-pd", 95.0)],
    ]
    found = {(r.system, r.peer, r.metric): r for r in ratio_spreads(rounds)}
    tok = found[("cleave-pd", "vllm", "output_tok_s")]
    assert tok.values == (0.9, 1.0, 0.95)
    assert tok.spread is not None and (tok.spread.median, tok.spread.low, tok.spread.high) == (0.95, 0.9, 1.0)
    # Only Cleave systems are the numerator.
    assert not any(system == "vllm" for system, _, _ in found)
    medians = metric_spreads(rounds)
    assert medians["vllm"]["output_tok_s"] is not None
    assert medians["vllm"]["output_tok_s"].median == 100.0


def test_a_system_missing_from_a_round_leaves_a_gap_not_a_shift() -> None:
    rounds = [
        [outcome("vllm", 100.0), outcome("cleave-pd", 80.0)],
        [outcome("vllm", 100.0), SystemOutcome("cleave-pd", "", None, error="did not start")],
    ]
    tok = next(r for r in ratio_spreads(rounds) if r.metric == "output_tok_s")
    assert tok.values == (0.8, None)
    assert tok.spread is not None and tok.spread.n == 1


def test_goodput_counts_requests_meeting_both_objectives() -> None:
    pair = parse_slo_pair("2000:100")
    assert pair == SloPair(2000.0, 100.0) and pair.key == "goodput_ttft2000_itl100"
    records = [
        record(1.0, (0.05,) * 20),  # meets both
        record(2.5, (0.05,) * 20),  # TTFT too slow
        record(1.0, (0.05,) * 19 + (0.5,)),  # one stall: its p99 gap is over 100 ms
        record(1.0, ()),  # one chunk: no gap to miss
        record(1.0, (0.01,), ok=False),  # failed
    ]
    assert request_itl_p99_ms(records[2]) > 100.0
    assert goodput(records, duration_s=2.0, pair=pair) == 1.0  # 2 requests in 2 s
    assert goodput(records, duration_s=0.0, pair=pair) == 0.0


@pytest.mark.parametrize("text", ["2000", "0:100", "a:b", "2000:-1"])
def test_bad_slo_pairs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="TTFT_MS:ITL_P99_MS"):
        parse_slo_pair(text)


def test_cpu_per_token_by_role_and_the_serving_layer() -> None:
    per = cpu_ms_per_token({"gateway": 0.5, "tokenizer": 0.25, "engine": 4.0}, output_tokens=1000)
    assert per == {"gateway": 0.5, "tokenizer": 0.25, "engine": 4.0, "serving": 0.75}
    assert cpu_ms_per_token({"engine": 1.0}, 0) == {}
    rounds = [
        [outcome("cleave-pd", 90.0, cpu_s={"gateway": 0.4, "engine": 3.0})],
        [outcome("cleave-pd", 90.0, cpu_s={"gateway": 0.6, "engine": 5.0})],
    ]
    gateway = cpu_spreads(rounds)["cleave-pd"]["gateway"]
    assert gateway is not None and (gateway.median, gateway.low, gateway.high) == pytest.approx(
        (0.5, 0.4, 0.6)
    )


def test_rounds_report_has_every_table(tmp_path: Path) -> None:
    pairs = (SloPair(2000.0, 100.0), SloPair(5000.0, 250.0))
    good = {pairs[0].key: 0.5, pairs[1].key: 0.9}
    rounds = [
        [
            outcome("vllm", 100.0, goodput=good, cpu_s={"api-server": 0.3, "engine": 3.0}),
            outcome("cleave-pd", 90.0, goodput=good, cpu_s={"gateway": 0.4, "engine": 3.0}),
        ],
        [
            outcome("vllm", 100.0, goodput=good, cpu_s={"api-server": 0.3, "engine": 3.0}),
            outcome("cleave-pd", 110.0, goodput=good, cpu_s={"gateway": 0.4, "engine": 3.0}),
        ],
    ]
    orders = round_orders(["vllm", "cleave-pd"], 2)
    note = rounds_report.nixl_note(ServingSettings(model_path=Path("/m"), vllm_pd_progress_delay_us=1000))
    written = rounds_report.write(tmp_path, {"short-chat": rounds}, orders, pairs, [note])
    text = (tmp_path / "short-chat.rounds.md").read_text()
    assert "round 1: vllm, cleave-pd; round 2: cleave-pd, vllm" in text
    assert "| cleave-pd ÷ vllm |" in text and "1.00 [0.90–1.10]" in text
    assert "TTFT ≤ 2000 ms, ITL p99 ≤ 100 ms" in text and "0.500 [0.500–0.500]" in text
    assert "## CPU per generated token (ms), by process" in text and "| serving |" in text
    assert "1000 us poll interval" in text and "vLLM's default is 0 us, busy polling" in text
    data = json.loads((tmp_path / "short-chat.rounds.json").read_text())
    assert data["orders"] == [["vllm", "cleave-pd"], ["cleave-pd", "vllm"]]
    assert data["cpu_ms_per_token"]["cleave-pd"]["serving"]["median"] == pytest.approx(0.4)
    assert len(written) == 2


def test_sweep_points_are_medians_over_rounds_per_rate() -> None:
    points = [
        sweep.SweepPoint("short-chat", "vllm", 1.0, 0, summary(40.0, ttft=100.0), {"g": 1.0}),
        sweep.SweepPoint("short-chat", "vllm", 1.0, 1, summary(60.0, ttft=300.0), {"g": 0.0}),
        sweep.SweepPoint("short-chat", "vllm", 2.0, 0, summary(80.0), {"g": 2.0}),
        sweep.SweepPoint("short-chat", "cleave-pd", 1.0, 0, None, {}),
    ]
    found = sweep.series(points, "short-chat")
    assert list(found) == ["vllm"]  # the failed run is left out of the plot
    (rate1, s1), (rate2, _) = found["vllm"]
    assert (rate1, rate2) == (1.0, 2.0)
    assert s1.output_throughput == 50.0 and s1.ttft_ms is not None and s1.ttft_ms.p50 == 200.0
    text = sweep.markdown(points, "short-chat", {"g": "pair"})
    assert "| vllm | 1 | 10/10 | 50.0 | 200 |" in text and "| 0.500 |" in text
    assert "failed: cleave-pd at 1 req/s (round 1)" in text
