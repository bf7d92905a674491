from __future__ import annotations

import math
from pathlib import Path

import pytest

from tools.bench.cli import parse_args
from tools.bench.config import BenchConfig, Slos

BASE = ["--url", "http://127.0.0.1:8000", "--model", "smollm2"]


def test_defaults_are_a_closed_loop_of_one() -> None:
    options = parse_args(BASE)
    config = options.config
    assert options.rates == (None,)
    assert (config.rate, config.concurrency, config.num_requests) == (None, 1, 100)
    assert config.workload.name == "random" and config.api == "completions"
    assert options.output is None and options.plots is None and options.progress


def test_rate_list_is_a_sweep_without_a_concurrency_cap() -> None:
    options = parse_args([*BASE, "--rate", "1,2.5,inf", "--burstiness", "0.5", "--output", "r.json"])
    assert options.rates == (1.0, 2.5, math.inf)
    assert options.config.rate == 1.0 and options.config.concurrency is None
    assert options.config.burstiness == 0.5 and options.output == Path("r.json")


def test_duration_alone_has_no_request_limit() -> None:
    config = parse_args([*BASE, "--rate", "4", "--duration-s", "30"]).config
    assert (config.num_requests, config.duration_s) == (None, 30.0)


def test_workload_flags_reach_the_config() -> None:
    argv = [*BASE, "--workload", "prefix", "--num-prefixes", "2", "--prefix-len", "100"]
    argv += ["--suffixes-per-prefix", "3", "--suffix-len", "9", "--len-spread", "0.2", "--api", "chat"]
    config = parse_args(argv).config
    workload = config.workload
    assert (workload.name, workload.num_prefixes, workload.prefix_len) == ("prefix", 2, 100)
    assert (workload.suffixes_per_prefix, workload.suffix_len, workload.len_spread) == (3, 9, 0.2)
    assert config.api == "chat"


def test_goodput_slos() -> None:
    config = parse_args([*BASE, "--goodput", "ttft:500", "tpot:50"]).config
    assert config.goodput == Slos(ttft_ms=500, tpot_ms=50)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--goodput", "latency:5"], "expected KEY:MS"),
        (["--goodput", "ttft:fast"], "not a number"),
        (["--rate", "0"], "rates must be > 0"),
        (["--rate", "inf", "--duration-s", "5", "--num-requests", "0"], "num_requests must be >= 1"),
        (["--workload", "prefix", "--prefix-len", "0"], "prefix_len must be >= 1"),
    ],
)
def test_bad_flags_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*BASE, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_infinite_rate_needs_a_request_count() -> None:
    with pytest.raises(ValueError, match="infinite rate needs num_requests"):
        BenchConfig(url="http://x", model="m", rate=math.inf, num_requests=None, duration_s=5)


def test_base_url_accepts_v1_suffix() -> None:
    for url in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert BenchConfig(url=url, model="m").base_url == "http://h:1"
