"""GuideLLM (0.8.1) as an independent second measurement of the same endpoints.

GuideLLM cannot share Cleave's lock (it needs click < 8.5), so it lives in its own virtual
environment, installed from the hashed lock third_party/guidellm/requirements_lock.txt. Each
comparison workload becomes a GuideLLM scenario file (a `BenchmarkScenario`: backend, profile,
synthetic data, constraints, JSON output) that mirrors it as closely as GuideLLM's options
allow; the JSON report it writes is parsed for TTFT and ITL medians.

What GuideLLM calls ITL is each request's mean gap, (last token - first token) / (tokens - 1),
weighted by its gaps; tools/bench calls that TPOT (its ITL is every gap between chunks). So the
cross-check puts GuideLLM's ITL next to tools/bench's TPOT.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.stats import Summary
from tools.bench.systems.presets import CompareSizes

DEFAULT_VENV = Path.home() / ".cache" / "cleave" / "guidellm-venv"
LOCK_RELATIVE = Path("third_party") / "guidellm" / "requirements_lock.txt"
STAMP_NAME = ".cleave-lock-sha256"
FLAG_THRESHOLD = 0.10  # relative difference above which a pair of numbers is flagged


def repo_lock_path() -> Path:
    """The lock in this checkout (or in a `bazel run` runfiles tree, which has the same layout)."""
    return Path(os.path.abspath(__file__)).parents[3] / LOCK_RELATIVE


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def guidellm_binary(venv: Path) -> Path:
    return venv / "bin" / "guidellm"


def venv_is_current(venv: Path, lock: Path) -> bool:
    """Whether `venv` was installed from exactly this lock (its sha256 is stamped after install)."""
    stamp = venv / STAMP_NAME
    try:
        return guidellm_binary(venv).exists() and stamp.read_text().strip() == _sha256(lock)
    except OSError:
        return False


def install_commands(venv: Path, lock: Path, python: str, find_links: Sequence[str] = ()) -> list[list[str]]:
    """Commands that (re)create `venv` from the lock: every package pinned and hash-checked,
    nothing resolved (--no-deps: the lock is the whole closure)."""
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    install = [
        *pip,
        "install",
        "--require-hashes",
        "--no-deps",
        "--disable-pip-version-check",
        "-r",
        str(lock),
    ]
    for location in find_links:
        install += ["--find-links", location]
    return [[python, "-m", "venv", "--clear", str(venv)], install]


def write_stamp(venv: Path, lock: Path) -> None:
    (venv / STAMP_NAME).write_text(_sha256(lock) + "\n")


def isolated_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its Python import path (under `bazel run` it points
    into Cleave's own packages, which must not shadow the venv's), offline for Hugging Face."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    env.update(extra or {})
    return env


def _synthetic_data(workload: str, sizes: CompareSizes) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": "synthetic_text",
        "prompt_tokens": sizes.short_input_len,
        "output_tokens": sizes.output_len,
    }
    if workload == "prefix":
        # GuideLLM draws one of prefix_count prefixes per request (tools/bench deals them out in
        # shuffled rounds); in chat requests the prefix is a system message.
        data["prefix_count"] = sizes.num_prefixes
        data["prefix_tokens"] = sizes.prefix_len
    elif workload == "long-interference":
        # GuideLLM has no mixture of prompt lengths; a weighted prefix bucket of distinct long
        # prefixes (one bucket with an empty prefix) gives the same share of long prompts. Draws
        # are with replacement, so with 4x as many prefixes as expected long requests a few
        # long prompts may repeat (and hit the prefix cache).
        long_percent = round(sizes.long_fraction * 100)
        expected_long = max(1, math.ceil(sizes.long_requests * sizes.long_fraction))
        data["prefix_buckets"] = [
            {"bucket_weight": 100 - long_percent, "prefix_count": 1, "prefix_tokens": 0},
            {
                "bucket_weight": long_percent,
                "prefix_count": 4 * expected_long,
                "prefix_tokens": max(1, sizes.long_input_len - sizes.short_input_len),
            },
        ]
    return data


def _profile(workload: str, sizes: CompareSizes) -> dict[str, Any]:
    if workload == "short-chat":
        return {"kind": "concurrent", "streams": [sizes.short_concurrency]}
    if workload == "prefix":
        return {"kind": "concurrent", "streams": [sizes.prefix_concurrency]}
    return {"kind": "poisson", "rate": [sizes.long_rate]}


def scenario(
    workload: str,
    sizes: CompareSizes,
    *,
    target: str,
    model: str,
    tokenizer: Path,
    output_json: Path,
) -> dict[str, Any]:
    """A GuideLLM scenario file (BenchmarkScenario) mirroring one comparison workload."""
    backend = {
        "kind": "openai_http",
        "target": target,
        "model": model,
        "request_format": "/v1/chat/completions",
        "timeout": sizes.timeout_s,
        "http2": False,
        "extras": {
            "body": {
                "temperature": 0.0,
                # GuideLLM asks for stream_options {include_usage, continuous_usage_stats}; Cleave's
                # gateway refuses continuous_usage_stats (vLLM's extension), so no system gets
                # stream_options: GuideLLM then counts one token per streamed chunk, as
                # tools/bench does without a usage chunk.
                "stream_options": None,
            }
        },
    }
    spec = {
        "backend": backend,
        "profile": _profile(workload, sizes),
        "constraints": [{"kind": "max_requests", "count": sizes.num_requests(workload)}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [_synthetic_data(workload, sizes)],
        "seed": {"kind": "static", "value": sizes.seed},
        "outputs": [{"kind": "json", "path": str(output_json)}],
    }
    return {
        "metadata": {"labels": {"source": "cleave tools/bench compare", "workload": workload}},
        "spec": spec,
    }


def run_command(venv: Path, scenario_path: Path) -> list[str]:
    return [
        str(guidellm_binary(venv)),
        "run",
        "--scenario",
        str(scenario_path),
        "--disable-console-interactive",
    ]


@dataclass(frozen=True)
class GuidellmResult:
    version: str
    successful: int
    errored: int
    incomplete: int
    ttft_p50_ms: float | None
    itl_p50_ms: float | None  # GuideLLM's ITL: per-request mean gap (tools/bench's TPOT)


class ReportError(ValueError):
    """The GuideLLM report is missing or not in the expected shape."""


def _median(metric: Any) -> float | None:
    if not isinstance(metric, dict):
        raise ReportError("a latency metric is not an object")
    successful = metric.get("successful")
    if not isinstance(successful, dict) or not successful.get("count"):
        return None
    return float(successful["median"])


def parse_report(report: Mapping[str, Any]) -> GuidellmResult:
    """TTFT/ITL medians of successful requests in the last benchmark of a GuideLLM JSON report
    (GenerativeBenchmarksReport, schema version 2)."""
    try:
        version = str(report["metadata"]["guidellm_version"])
        benchmarks = report["benchmarks"]
        if not benchmarks:
            raise ReportError("the report holds no benchmark (did every request fail?)")
        metrics = benchmarks[-1]["metrics"]
        totals = metrics["request_totals"]
        return GuidellmResult(
            version=version,
            successful=int(totals["successful"]),
            errored=int(totals["errored"]),
            incomplete=int(totals["incomplete"]),
            ttft_p50_ms=_median(metrics["time_to_first_token_ms"]),
            itl_p50_ms=_median(metrics["inter_token_latency_ms"]),
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise ReportError(f"unexpected GuideLLM report shape: missing {exc}") from None


def load_report(path: Path) -> GuidellmResult:
    try:
        return parse_report(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read GuideLLM report {path}: {exc}") from None


@dataclass(frozen=True)
class CrossCheck:
    metric: str
    bench_ms: float | None
    guidellm_ms: float | None

    @property
    def difference(self) -> float | None:
        """(GuideLLM - tools/bench) / tools/bench."""
        if self.bench_ms is None or self.guidellm_ms is None or self.bench_ms == 0:
            return None
        return (self.guidellm_ms - self.bench_ms) / self.bench_ms

    @property
    def flagged(self) -> bool:
        return self.difference is not None and abs(self.difference) > FLAG_THRESHOLD


def cross_check(summary: Summary, result: GuidellmResult) -> list[CrossCheck]:
    """tools/bench's medians next to GuideLLM's, definition for definition."""
    return [
        CrossCheck("TTFT p50", summary.ttft_ms.p50 if summary.ttft_ms else None, result.ttft_p50_ms),
        CrossCheck(
            "TPOT p50 (GuideLLM: ITL p50)",
            summary.tpot_ms.p50 if summary.tpot_ms else None,
            result.itl_p50_ms,
        ),
    ]


@dataclass(frozen=True)
class GuidellmOutcome:
    """One GuideLLM run: its result, or why there is none; where its files are."""

    result: GuidellmResult | None
    error: str | None
    report_path: Path
    log_path: Path
