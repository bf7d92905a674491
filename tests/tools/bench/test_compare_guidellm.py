"""The GuideLLM cross-check: scenarios, commands, the venv's reuse, report parsing.

The report fixture (third_party/guidellm/testdata) was written by make_test_fixture.py with
GuideLLM 0.8.1's own pydantic models, so it has the shape `guidellm run` writes; the
scenarios below were validated by GuideLLM's BenchmarkScenario when this was written.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tools.bench.stats import Distribution, Summary
from tools.bench.systems import guidellm
from tools.bench.systems.presets import CompareSizes

FIXTURE = Path(os.path.abspath(__file__)).parents[3] / "third_party/guidellm/testdata/report_v2_trimmed.json"


def spec(workload: str, sizes: CompareSizes | None = None) -> dict[str, Any]:
    return guidellm.scenario(
        workload,
        sizes or CompareSizes(),
        target="http://127.0.0.1:8000",
        model="smollm2",
        tokenizer=Path("/models/smollm2"),
        output_json=Path("/out/report.json"),
    )["spec"]


def test_short_chat_is_a_fixed_concurrency_chat_run() -> None:
    s = spec(
        "short-chat", CompareSizes(short_concurrency=3, short_requests=30, output_len=50, short_input_len=35)
    )
    assert s["profile"] == {"kind": "concurrent", "streams": [3]}
    assert s["constraints"] == [{"kind": "max_requests", "count": 30}]
    assert s["data"] == [{"kind": "synthetic_text", "prompt_tokens": 35, "output_tokens": 50}]
    backend = s["backend"]
    assert backend["kind"] == "openai_http" and backend["request_format"] == "/v1/chat/completions"
    assert (backend["target"], backend["model"]) == ("http://127.0.0.1:8000", "smollm2")
    # No stream_options: Cleave's gateway refuses GuideLLM's continuous_usage_stats.
    assert backend["extras"] == {"body": {"temperature": 0.0, "stream_options": None}}
    assert s["tokenizer"] == {"kind": "huggingface_auto", "model": "/models/smollm2"}
    assert s["outputs"] == [{"kind": "json", "path": "/out/report.json"}]
    assert s["seed"] == {"kind": "static", "value": 0}


def test_long_interference_is_poisson_with_the_same_share_of_long_prompts() -> None:
    sizes = CompareSizes(
        long_rate=0.25, long_fraction=0.2, long_requests=50, long_input_len=1500, short_input_len=40
    )
    s = spec("long-interference", sizes)
    assert s["profile"] == {"kind": "poisson", "rate": [0.25]}
    assert s["constraints"] == [{"kind": "max_requests", "count": 50}]
    (data,) = s["data"]
    short, long = data["prefix_buckets"]
    assert (short["bucket_weight"], long["bucket_weight"]) == (80, 20)
    assert short["prefix_tokens"] == 0
    # prefix + prompt = the long prompt's length; 4x the expected number of long requests.
    assert long["prefix_tokens"] + data["prompt_tokens"] == 1500
    assert long["prefix_count"] == 40


def test_prefix_shares_the_same_prefixes() -> None:
    (data,) = spec("prefix", CompareSizes(num_prefixes=3, prefix_len=256))["data"]
    assert (data["prefix_count"], data["prefix_tokens"]) == (3, 256)
    assert spec("prefix", CompareSizes(prefix_concurrency=2))["profile"] == {
        "kind": "concurrent",
        "streams": [2],
    }


def test_commands() -> None:
    venv, lock = Path("/v"), Path("/repo/lock.txt")
    assert guidellm.run_command(venv, Path("/s.json")) == [
        "/v/bin/guidellm", "run", "--scenario", "/s.json", "--disable-console-interactive",
    ]  # fmt: skip
    create, install = guidellm.install_commands(venv, lock, "/usr/bin/python3", ["/opt/wheels"])
    assert create == ["/usr/bin/python3", "-m", "venv", "--clear", "/v"]
    assert install[:3] == ["/v/bin/python", "-m", "pip"]
    assert {"--require-hashes", "--no-deps"} <= set(install)
    assert install[install.index("-r") + 1] == "/repo/lock.txt"
    assert install[install.index("--find-links") + 1] == "/opt/wheels"


def test_the_venv_is_reused_only_when_made_from_this_lock(tmp_path: Path) -> None:
    venv, lock = tmp_path / "venv", tmp_path / "lock.txt"
    lock.write_text("guidellm==0.8.1 --hash=sha256:aa\n")
    assert not guidellm.venv_is_current(venv, lock)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "guidellm").write_text("#!/bin/sh\n")
    assert not guidellm.venv_is_current(venv, lock)  # installed, but from which lock?
    guidellm.write_stamp(venv, lock)
    assert guidellm.venv_is_current(venv, lock)
    lock.write_text("guidellm==0.8.2 --hash=sha256:bb\n")
    assert not guidellm.venv_is_current(venv, lock)


def test_guidellm_runs_without_cleaves_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/runfiles/pypi")
    monkeypatch.setenv("KEEP_ME", "1")
    env = guidellm.isolated_environment({"EXTRA": "x"})
    assert "PYTHONPATH" not in env
    assert (env["KEEP_ME"], env["EXTRA"], env["HF_HUB_OFFLINE"]) == ("1", "x", "1")


def report() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def test_parse_report() -> None:
    result = guidellm.parse_report(report())
    # The fixture's successful TTFTs are 100/120/140/400 ms and ITLs 20/22/25/30 ms; GuideLLM's
    # median is its distribution's, which the fixture carries.
    expected = report()["benchmarks"][0]["metrics"]
    assert result.ttft_p50_ms == expected["time_to_first_token_ms"]["successful"]["median"] == 120.0
    assert result.itl_p50_ms == expected["inter_token_latency_ms"]["successful"]["median"] == 22.0
    assert (result.version, result.successful, result.errored, result.incomplete) == ("0.8.1", 4, 1, 0)


def test_parse_report_refuses_other_shapes(tmp_path: Path) -> None:
    empty = report()
    empty["benchmarks"] = []
    with pytest.raises(guidellm.ReportError, match="no benchmark"):
        guidellm.parse_report(empty)
    broken = copy.deepcopy(report())
    del broken["benchmarks"][0]["metrics"]["time_to_first_token_ms"]
    with pytest.raises(guidellm.ReportError, match="time_to_first_token_ms"):
        guidellm.parse_report(broken)
    none_ok = copy.deepcopy(report())
    none_ok["benchmarks"][0]["metrics"]["inter_token_latency_ms"]["successful"]["count"] = 0
    assert guidellm.parse_report(none_ok).itl_p50_ms is None
    with pytest.raises(guidellm.ReportError, match="cannot read"):
        guidellm.load_report(tmp_path / "missing.json")


def _dist(p50: float) -> Distribution:
    return Distribution(count=4, mean=p50, p50=p50, p90=p50, p99=p50)


def summary(ttft_p50: float, tpot_p50: float) -> Summary:
    return Summary(
        duration_s=1.0, requests=4, completed=4, errors=0, error_messages=(), input_tokens=100,
        output_tokens=256, request_throughput=4.0, output_throughput=256.0, total_token_throughput=356.0,
        goodput=None, ttft_ms=_dist(ttft_p50), tpot_ms=_dist(tpot_p50), itl_ms=_dist(tpot_p50), e2e_ms=_dist(900.0),
    )  # fmt: skip


def test_cross_check_flags_differences_above_ten_percent() -> None:
    result = guidellm.parse_report(report())  # TTFT 120, ITL 22
    ttft, tpot = guidellm.cross_check(summary(ttft_p50=100.0, tpot_p50=21.0), result)
    assert (ttft.bench_ms, ttft.guidellm_ms) == (100.0, 120.0)
    assert ttft.difference == pytest.approx(0.20) and ttft.flagged
    assert tpot.difference == pytest.approx(1 / 21) and not tpot.flagged
    (_, close) = guidellm.cross_check(summary(ttft_p50=120.0, tpot_p50=24.2), result)
    assert close.difference == pytest.approx(-2.2 / 24.2) and not close.flagged
    (_, far) = guidellm.cross_check(summary(ttft_p50=120.0, tpot_p50=25.0), result)
    assert far.flagged  # 22 vs 25: -12%
