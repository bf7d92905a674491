"""Human-readable tables and the JSON results file."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.bench.config import BenchConfig
from tools.bench.runner import BenchResult
from tools.bench.stats import Distribution

_LATENCIES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


def describe_arrival(config: BenchConfig) -> str:
    if config.rate is None:
        return f"closed loop, concurrency {config.concurrency}"
    # A multiturn session's later turns follow its answers; only sessions arrive at the rate.
    unit = "sessions/s" if config.workload.name == "multiturn" else "req/s"
    text = f"rate {config.rate:g} {unit}"
    if config.burstiness != 1.0:
        text += f" (burstiness {config.burstiness:g})"
    if config.concurrency is not None:
        text += f", at most {config.concurrency} in flight"
    return text


def describe_slos(config: BenchConfig) -> str:
    slos = config.goodput
    parts = [
        (name, value)
        for name, value in (("ttft", slos.ttft_ms), ("tpot", slos.tpot_ms), ("e2e", slos.e2e_ms))
    ]
    return ", ".join(f"{name} <= {value:g} ms" for name, value in parts if value is not None)


def format_summary(result: BenchResult) -> str:
    config, summary = result.config, result.summary
    lines = [
        f"== {config.workload.name} workload, {describe_arrival(config)}, {config.api} API, model {config.model} ==",
        f"Requests       {summary.requests} started, {summary.completed} completed, {summary.errors} failed"
        f" in {summary.duration_s:.2f} s",
        f"Throughput     {summary.request_throughput:.2f} req/s, {summary.output_throughput:.1f} output tok/s,"
        f" {summary.total_token_throughput:.1f} total tok/s",
        f"Tokens         {summary.input_tokens} input, {summary.output_tokens} output",
    ]
    if summary.goodput is not None:
        lines.append(f"Goodput        {summary.goodput:.2f} req/s ({describe_slos(config)})")
    lines.append(f"{'Latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'count':>8}")
    for label, name in _LATENCIES:
        dist: Distribution | None = getattr(summary, name)
        if dist is None:
            lines.append(f"{label:<14}{'-':>10}{'-':>10}{'-':>10}{'-':>10}{0:>8}")
        else:
            lines.append(
                f"{label:<14}{dist.mean:>10.2f}{dist.p50:>10.2f}{dist.p90:>10.2f}{dist.p99:>10.2f}{dist.count:>8}"
            )
    if summary.error_messages:
        lines.append("Errors (first distinct messages):")
        lines += [f"  - {message}" for message in summary.error_messages]
    return "\n".join(lines)


def format_sweep(results: Sequence[BenchResult]) -> str:
    """One line per run: the throughput and latency percentiles side by side."""
    header = (
        f"{'rate':>8}{'req/s':>9}{'tok/s':>9}{'goodput':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
        f"{'TPOT p50':>10}{'TPOT p99':>10}{'E2E p50':>10}{'E2E p99':>10}{'errors':>8}"
    )
    lines = ["== sweep (latencies in ms) ==", header]
    for result in results:
        s = result.summary
        rate = "closed" if result.config.rate is None else f"{result.config.rate:g}"

        def pct(dist: Distribution | None, which: str) -> str:
            return f"{getattr(dist, which):>10.1f}" if dist is not None else f"{'-':>10}"

        goodput = f"{s.goodput:>9.2f}" if s.goodput is not None else f"{'-':>9}"
        lines.append(
            f"{rate:>8}{s.request_throughput:>9.2f}{s.output_throughput:>9.1f}{goodput}"
            f"{pct(s.ttft_ms, 'p50')}{pct(s.ttft_ms, 'p99')}{pct(s.tpot_ms, 'p50')}{pct(s.tpot_ms, 'p99')}"
            f"{pct(s.e2e_ms, 'p50')}{pct(s.e2e_ms, 'p99')}{s.errors:>8}"
        )
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    # JSON has no infinity (rate inf = all at once).
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def results_json(results: Sequence[BenchResult]) -> dict[str, Any]:
    """Config of the first run, then per run its rate, seed, summary and request records."""
    runs = [
        {
            "rate": result.config.rate,
            "seed": result.config.seed,
            "summary": dataclasses.asdict(result.summary),
            "records": [dataclasses.asdict(record) for record in result.records],
        }
        for result in results
    ]
    config = dataclasses.asdict(results[0].config) if results else {}
    config.pop("api_key", None)  # a secret, not a result
    return _json_safe({"config": config, "runs": runs})


def write_json(path: Path, results: Sequence[BenchResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results_json(results), indent=2) + "\n", encoding="utf-8")
