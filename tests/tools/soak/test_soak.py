"""The soak tool against the benchmark's fake OpenAI server (known delays): outcomes are
counted, a server that stops sending is reported hung (and fails the run), RSS trends are
least-squares slopes, and the request mix follows its fractions."""

from __future__ import annotations

import asyncio
import os
import random

import httpx
import pytest

from tests.tools.bench.fake_openai import FakeOpenAI, serve
from tools.soak.client import Outcome, run_one
from tools.soak.main import main
from tools.soak.memory import Series, TreeSampler
from tools.soak.report import as_json, as_text
from tools.soak.runner import SoakOptions, soak
from tools.soak.workload import Ending, Mix, Scenario, draw


def test_a_healthy_server_completes_and_aborts_and_nothing_hangs() -> None:
    with serve(FakeOpenAI(ttft_s=0.02, itl_s=0.005)) as fake:
        options = SoakOptions(base_url=fake.url, duration_s=2.0, concurrency=4, stall_s=5.0, sample_s=0.2)
        sampler = TreeSampler([os.getpid()])  # this process: the fake server runs in it
        result = asyncio.run(soak(options, sampler))
    assert result.hung == 0
    assert result.count("completed") > 0 and result.count("aborted") > 0
    assert result.count("error") == 0, result.errors_by_detail()
    # Every request the server saw is counted (plus the check afterwards); early disconnects
    # may leave before the server reads the body.
    assert len(fake.bodies) - 1 <= len(result.outcomes)
    assert result.checks["valid request afterwards"] == "ok"
    assert result.checks["workers healthy and idle afterwards"].startswith("skipped")  # not a Cleave gateway
    assert not result.failed_checks
    summary = as_json(result, sampler, warmup_s=0.5)
    assert summary["processes"] and summary["processes"][0]["samples"] >= 5
    assert "hung 0" in as_text(summary)
    assert summary["disconnected_early"] <= summary["aborted"]


def test_an_early_disconnect_leaves_before_the_answer() -> None:
    scenario = Scenario(
        "/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 3, "stream": True},
        Ending.DISCONNECT_EARLY, disconnect_after_s=0.1,
    )  # fmt: skip

    async def one(url: str) -> Outcome:
        async with httpx.AsyncClient() as client:
            return await run_one(client, url, scenario, stall_s=30)

    with serve(FakeOpenAI(ttft_s=5.0)) as fake:
        result = asyncio.run(one(fake.url))
    assert (result.result, result.detail) == ("aborted", "disconnected early")


def test_a_server_that_stops_sending_is_hung_and_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(FakeOpenAI(ttft_s=3.0, itl_s=0.01)) as fake:
        options = SoakOptions(base_url=fake.url, duration_s=0.5, concurrency=2, stall_s=0.5)
        result = asyncio.run(soak(options, None))
        code = main(["--url", fake.url, "--duration-min", "0.01", "--concurrency", "2", "--stall-s", "0.5"])
    assert result.hung > 0
    assert all(o.result in ("hung", "aborted") for o in result.outcomes)
    assert code == 1
    assert "FAILED" in capsys.readouterr().err


def test_error_statuses_are_counted_with_an_example() -> None:
    with serve(FakeOpenAI(http_status=429)) as fake:
        result = asyncio.run(soak(SoakOptions(base_url=fake.url, duration_s=0.3, concurrency=2), None))
    assert result.errors_by_detail().keys() == {"429"}
    assert "fake failure" in result.error_examples()["429"]
    assert result.hung == 0


def test_slope_is_least_squares_in_mib_per_minute() -> None:
    series = Series(1, "p", [(t, 100.0 + 0.5 * t + (1 if t % 2 else -1)) for t in range(0, 120, 5)])
    assert series.slope_mib_per_min() == pytest.approx(30.0, rel=0.05)
    assert series.slope_mib_per_min(after_s=1000) is None  # too few points
    flat = Series(2, "q", [(t, 50.0) for t in range(10)])
    assert flat.slope_mib_per_min() == 0.0


def test_the_mix_follows_its_fractions() -> None:
    rng = random.Random(1)
    mix = Mix(nonstream=0.2, abort_mid_stream=0.3, disconnect_early=0.1, max_tokens=10)
    scenarios = [draw(rng, "m", mix) for _ in range(4000)]
    share = {e: sum(1 for s in scenarios if s.ending is e) / len(scenarios) for e in Ending}
    unary = sum(1 for s in scenarios if not s.stream) / len(scenarios)
    assert unary == pytest.approx(0.2, abs=0.03)
    assert share[Ending.ABORT_MID_STREAM] == pytest.approx(0.3, abs=0.03)
    assert share[Ending.DISCONNECT_EARLY] == pytest.approx(0.1, abs=0.03)
    assert all(1 <= s.body["max_tokens"] <= 10 for s in scenarios)
    assert {s.kind for s in scenarios} == {
        "chat/stream",
        "chat/unary",
        "completions/stream",
        "completions/unary",
    }
