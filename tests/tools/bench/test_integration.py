"""The benchmark against an in-process fake server whose delays are known."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.rpc.ports import free_port
from tests.tools.bench.fake_openai import MODEL, FakeOpenAI, serve
from tools.bench.arrival import inter_arrival_gaps
from tools.bench.config import BenchConfig, Slos, WorkloadConfig
from tools.bench.main import main
from tools.bench.runner import BenchError, run_benchmark, run_sweep

pytestmark = pytest.mark.anyio

TTFT_S = 0.12
ITL_S = 0.03
TOKENS = 6


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve(FakeOpenAI(ttft_s=TTFT_S, itl_s=ITL_S)) as server:
        yield server


def config(fake: FakeOpenAI, **fields: Any) -> BenchConfig:
    workload = fields.pop("workload", WorkloadConfig(input_len=12, output_len=TOKENS))
    return BenchConfig(url=fake.url, model=MODEL, workload=workload, **fields)


async def test_measured_latencies_match_the_servers_delays(fake: FakeOpenAI) -> None:
    result = await run_benchmark(config(fake, concurrency=3, num_requests=6, goodput=Slos(ttft_ms=60_000)))
    assert [r.request_id for r in result.records] == list(range(6))
    assert all(r.ok and r.output_tokens == TOKENS and r.prompt_tokens == 7 for r in result.records)
    for r in result.records:
        assert r.ttft_s is not None and r.e2e_s is not None
        assert r.ttft_s >= TTFT_S
        assert len(r.itl_s) == TOKENS - 1
        assert r.e2e_s >= r.ttft_s + sum(r.itl_s)
        # The server waits ITL_S between chunks; the client may see a chunk late, so an
        # individual gap can be shorter, but the decode phase as a whole cannot be.
        assert r.e2e_s - r.ttft_s >= (TOKENS - 1) * ITL_S * 0.8
    summary = result.summary
    assert summary.completed == 6 and summary.errors == 0
    assert summary.ttft_ms is not None and TTFT_S * 1000 <= summary.ttft_ms.p50 < TTFT_S * 1000 + 500
    assert summary.itl_ms is not None and ITL_S * 1000 * 0.5 <= summary.itl_ms.mean < ITL_S * 1000 + 200
    assert summary.tpot_ms is not None and summary.tpot_ms.p50 >= ITL_S * 1000 * 0.8
    assert summary.goodput == pytest.approx(summary.request_throughput)
    assert summary.output_tokens == 6 * TOKENS
    assert all(body["stream"] and body["stream_options"] == {"include_usage": True} for body in fake.bodies)
    assert all(body["max_tokens"] == TOKENS for body in fake.bodies)
    # 6 requests, 3 at a time, each >= TTFT + 5 gaps: at least two rounds.
    assert summary.duration_s >= 2 * (TTFT_S + (TOKENS - 1) * ITL_S) * 0.95


async def test_multiturn_chat_resends_the_answers(fake: FakeOpenAI) -> None:
    workload = WorkloadConfig(name="multiturn", turns=3, input_len=4, output_len=3)
    result = await run_benchmark(config(fake, api="chat", workload=workload, concurrency=2, num_requests=6))
    assert result.summary.completed == 6
    assert sorted((r.session_id, r.turn) for r in result.records) == [
        (s, t) for s in (0, 1) for t in range(3)
    ]
    # Every request's TTFT skipped the empty role chunk the fake sends at once.
    assert all(r.ttft_s is not None and r.ttft_s >= TTFT_S for r in result.records)
    # Each turn's prompt estimate counts the earlier turns (4 words) and answers (3 tokens).
    assert sorted((r.turn, r.input_len) for r in result.records) == [
        (0, 4),
        (0, 4),
        (1, 11),
        (1, 11),
        (2, 18),
        (2, 18),
    ]
    last_turns = [b["messages"] for b in fake.bodies if len(b["messages"]) == 5]
    assert len(last_turns) == 2
    for messages in last_turns:
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
        assert messages[1]["content"] == messages[3]["content"] == " w0 w1 w2"


async def test_open_loop_rate_spaces_the_arrivals(fake: FakeOpenAI) -> None:
    result = await run_benchmark(config(fake, rate=25.0, concurrency=None, num_requests=8, seed=3))
    assert result.summary.completed == 8
    # Requests start on the arrival schedule of the seed's gaps (never early, the first at
    # once), not when earlier answers are done.
    gaps = list(itertools.islice(inter_arrival_gaps(25.0, 1.0, seed=3), 7))
    schedule = [sum(gaps[:i]) for i in range(8)]
    for record, planned in zip(result.records, schedule, strict=True):
        assert planned - 0.002 <= record.start_s <= planned + 0.25
    # Arrivals are not serialized behind answers: requests overlap in flight.
    assert any(
        b.start_s < a.start_s + (a.e2e_s or 0)
        for a, b in zip(result.records, result.records[1:], strict=False)
    )


async def test_duration_stops_starting_requests(fake: FakeOpenAI) -> None:
    result = await run_benchmark(config(fake, rate=20.0, concurrency=None, num_requests=None, duration_s=0.4))
    assert 1 <= len(result.records) < 30
    assert all(r.start_s < 0.4 for r in result.records)


async def test_server_errors_are_counted_with_their_messages() -> None:
    with serve(FakeOpenAI(ttft_s=0.01, itl_s=0.01, error_after_chunks=2)) as fake:
        result = await run_benchmark(config(fake, concurrency=2, num_requests=3))
    assert result.summary.errors == 3 and result.summary.completed == 0
    assert result.summary.error_messages == ("fake worker failed",)
    with serve(FakeOpenAI(http_status=429)) as fake:
        result = await run_benchmark(config(fake, num_requests=2))
    assert result.summary.error_messages == ("HTTP 429: fake failure",)


async def test_without_usage_tokens_are_counted_from_chunks() -> None:
    with serve(FakeOpenAI(ttft_s=0.01, itl_s=0.01, send_usage=False)) as fake:
        result = await run_benchmark(config(fake, num_requests=2))
    assert [(r.output_tokens, r.prompt_tokens) for r in result.records] == [(TOKENS, None)] * 2
    assert result.summary.input_tokens == 2 * 12  # the workload's estimate


async def test_unknown_model_and_failed_warmup_stop_before_measuring(fake: FakeOpenAI) -> None:
    with pytest.raises(BenchError, match="does not serve model 'other'"):
        await run_benchmark(replace_model(config(fake, num_requests=1), "other"))
    with serve(FakeOpenAI(http_status=500)) as failing:
        with pytest.raises(
            BenchError, match=re.escape("all 2 warmup requests failed, e.g.: HTTP 500: fake failure")
        ):
            await run_sweep(config(failing, num_requests=1, warmup_requests=2), [None])
        assert len(failing.bodies) == 2


def replace_model(config: BenchConfig, model: str) -> BenchConfig:
    return BenchConfig(**{**config.__dict__, "model": model})


def test_unreachable_url_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--url", f"http://127.0.0.1:{free_port()}", "--model", MODEL, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("bench: error: cannot reach http://127.0.0.1:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_sweep_writes_json_and_plots(
    fake: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", fake.url + "/v1", "--model", MODEL, "--rate", "10,40", "--num-requests", "4"]
    argv += ["--input-len", "8", "--output-len", "4", "--goodput", "ttft:5000", "e2e:10000", "--no-progress"]
    argv += ["--output", str(tmp_path / "out" / "results.json"), "--plots", str(tmp_path / "plots")]
    assert main([*argv, "--api-key", "sk-secret"]) == 0
    assert set(fake.authorizations) == {"Bearer sk-secret"}
    assert "sk-secret" not in (tmp_path / "out" / "results.json").read_text()
    out = capsys.readouterr().out
    assert "rate 10 req/s" in out and "rate 40 req/s" in out and "== sweep" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [run["rate"] for run in results["runs"]] == [10.0, 40.0]
    assert [run["seed"] for run in results["runs"]] == [0, 1]
    assert results["config"]["model"] == MODEL and results["config"]["goodput"]["ttft_ms"] == 5000
    for run in results["runs"]:
        assert run["summary"]["completed"] == 4 and len(run["records"]) == 4
        assert run["summary"]["goodput"] == pytest.approx(run["summary"]["request_throughput"])
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["latency_cdf.png", "latency_vs_rate.png", "throughput_vs_rate.png"]
    assert all((tmp_path / "plots" / name).read_bytes().startswith(b"\x89PNG") for name in names)
