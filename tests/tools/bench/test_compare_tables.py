"""Per-workload reports: the ratio table, the markdown page and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench.stats import Distribution, Summary
from tools.bench.systems.guidellm import GuidellmOutcome, GuidellmResult
from tools.bench.systems.presets import CompareSizes, bench_config
from tools.bench.systems.scrape import StageMean
from tools.bench.systems.tables import METRICS, SystemOutcome, markdown, ratios, workload_json


def dist(p50: float, p99: float | None = None) -> Distribution:
    return Distribution(count=10, mean=p50, p50=p50, p90=p50, p99=p99 if p99 is not None else p50 * 2)


def summary(ttft: float, itl: float, tok_s: float, completed: int = 10) -> Summary:
    return Summary(
        duration_s=10.0, requests=10, completed=completed, errors=10 - completed, error_messages=(),
        input_tokens=400, output_tokens=640, request_throughput=completed / 10.0, output_throughput=tok_s,
        total_token_throughput=tok_s + 40.0, goodput=None, ttft_ms=dist(ttft), tpot_ms=dist(itl * 1.1),
        itl_ms=dist(itl, itl * 5), e2e_ms=dist(ttft + 63 * itl),
    )  # fmt: skip


def outcomes() -> list[SystemOutcome]:
    return [
        SystemOutcome("vllm", "vLLM", summary(ttft=200.0, itl=40.0, tok_s=50.0)),
        SystemOutcome(
            "cleave-1p1d",
            "Cleave 1p1d",
            summary(ttft=100.0, itl=20.0, tok_s=80.0),
            stages={"prefill_stage_ms": StageMean(12.34, 10)},
            stage_notes={"kv_transfer_ms": "not measured: no metric"},
        ),
        SystemOutcome(
            "cleave-pd",
            "Cleave pd",
            summary(ttft=150.0, itl=50.0, tok_s=40.0),
            stage_notes={"prefill_stage_ms": "n/a: colocated"},
        ),
        SystemOutcome(
            "vllm-pd", "vLLM P/D", None, error="vllm-pd-decode exited with code 1 while starting\nlog"
        ),
    ]


def test_ratios_are_each_cleave_system_over_each_peer() -> None:
    found = {(r.system, r.peer, r.metric): r for r in ratios(outcomes())}
    pairs = {(s, p) for s, p, _ in found}
    assert pairs == {
        ("cleave-1p1d", "vllm"), ("cleave-1p1d", "cleave-pd"), ("cleave-1p1d", "vllm-pd"),
        ("cleave-pd", "vllm"), ("cleave-pd", "cleave-1p1d"), ("cleave-pd", "vllm-pd"),
    }  # fmt: skip
    assert found[("cleave-1p1d", "vllm", "ttft_p50_ms")].value == pytest.approx(0.5)
    assert found[("cleave-1p1d", "vllm", "itl_p99_ms")].value == pytest.approx(100.0 / 200.0)
    assert found[("cleave-1p1d", "vllm", "output_tok_s")].value == pytest.approx(1.6)
    assert found[("cleave-pd", "cleave-1p1d", "ttft_p50_ms")].value == pytest.approx(1.5)
    failed = found[("cleave-1p1d", "vllm-pd", "ttft_p50_ms")]
    assert (failed.value, failed.system_value, failed.peer_value) == (None, 100.0, None)
    assert len(found) == 6 * len(METRICS)


def test_a_system_without_successful_requests_has_no_numbers() -> None:
    nothing = SystemOutcome("vllm", "vLLM", summary(ttft=1.0, itl=1.0, tok_s=0.0, completed=0))
    assert set(nothing.values().values()) == {None}
    (ratio, *_) = ratios([SystemOutcome("cleave-pd", "x", summary(100.0, 20.0, 80.0)), nothing])
    assert ratio.value is None


def test_markdown_page() -> None:
    config = bench_config("long-interference", CompareSizes(), "http://system", "smollm2")
    page = markdown("long-interference", "long prompts while others decode", config, outcomes())
    lines = page.splitlines()
    assert lines[0] == "# long-interference"
    assert "rate 0.5 req/s" in page and "max_tokens 64 with ignore_eos" in page
    row = next(line for line in lines if line.startswith("| cleave-1p1d | 10/10"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:9] == ["100.0", "200.0", "22.0", "20.0", "100.0", "1360.0", "80.00"]
    assert cells[-3:] == ["12.3 (n=10)", "–", "not measured"]
    pd_row = next(line for line in lines if line.startswith("| cleave-pd |"))
    assert pd_row.strip("|").split("|")[-3].strip() == "n/a"
    assert any(line.startswith("| vllm-pd | failed |") for line in lines)
    ratio_row = next(line for line in lines if line.startswith("| cleave-1p1d ÷ vllm |"))
    assert [c.strip() for c in ratio_row.strip("|").split("|")][1:3] == ["0.50", "0.50"]
    assert "error: `vllm-pd-decode exited with code 1 while starting`" in page
    assert "- cleave-1p1d: kv_transfer_ms: not measured: no metric" in page
    assert "GuideLLM" not in page


def test_markdown_and_json_carry_the_guidellm_cross_check(tmp_path: Path) -> None:
    result = GuidellmResult(
        "0.8.1", successful=10, errored=0, incomplete=0, ttft_p50_ms=130.0, itl_p50_ms=22.5
    )
    checked = SystemOutcome(
        "cleave-1p1d", "Cleave", summary(ttft=100.0, itl=20.0, tok_s=80.0),
        guidellm=GuidellmOutcome(result, None, tmp_path / "r.json", tmp_path / "g.log"),
    )  # fmt: skip
    broken = SystemOutcome(
        "vllm", "vLLM", summary(ttft=200.0, itl=40.0, tok_s=50.0),
        guidellm=GuidellmOutcome(None, "GuideLLM exited with 2", tmp_path / "r2.json", tmp_path / "g2.log"),
    )  # fmt: skip
    config = bench_config("short-chat", CompareSizes(), "http://system", "smollm2")
    page = markdown("short-chat", "short", config, [checked, broken])
    row = next(line for line in page.splitlines() if line.startswith("| cleave-1p1d | 100.0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # TTFT 100 vs 130: +30% flagged; TPOT 22 vs ITL 22.5: +2.3%, not flagged.
    assert cells[1:] == ["100.0", "130.0", "30.0% ⚠", "22.0", "22.5", "2.3%", "10/0"]
    assert "| vllm | GuideLLM exited with 2 |" in page
    document = workload_json("short-chat", config, [checked, broken], {"cores": [0, 1]})
    text = json.dumps(document, allow_nan=False)
    assert json.loads(text)["systems"]["cleave-1p1d"]["guidellm"]["cross_check"][0] == {
        "metric": "TTFT p50", "bench_ms": 100.0, "guidellm_ms": 130.0, "difference": pytest.approx(0.3), "flagged": True,
    }  # fmt: skip
    assert document["systems"]["vllm"]["guidellm"]["error"] == "GuideLLM exited with 2"


def test_json_document() -> None:
    config = bench_config("prefix", CompareSizes(), "http://system", "smollm2")
    document = json.loads(
        json.dumps(workload_json("prefix", config, outcomes(), {"cores": [0, 1]}), allow_nan=False)
    )
    assert document["workload"] == "prefix" and document["meta"] == {"cores": [0, 1]}
    assert document["bench_config"]["workload"]["name"] == "prefix" and "url" not in document["bench_config"]
    cleave = document["systems"]["cleave-1p1d"]
    assert cleave["metrics"]["ttft_p50_ms"] == 100.0
    assert cleave["summary"]["completed"] == 10
    assert cleave["stages"]["prefill_stage_ms"] == {"mean_ms": 12.34, "count": 10}
    assert cleave["stages"]["kv_transfer_ms"] == {
        "mean_ms": None,
        "count": 0,
        "note": "not measured: no metric",
    }
    assert document["systems"]["vllm-pd"]["summary"] is None
    assert document["systems"]["vllm-pd"]["error"].startswith("vllm-pd-decode exited")
    assert {(r["system"], r["peer"]) for r in document["ratios"]} >= {("cleave-1p1d", "vllm")}
