"""One workload's results over every system: the numbers, Cleave-vs-peer ratios, the GuideLLM
cross-check, as a markdown page and a JSON document."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.bench.config import BenchConfig
from tools.bench.report import describe_arrival
from tools.bench.stats import Distribution, Summary
from tools.bench.systems.catalog import CLEAVE_PREFIX, STAGE_DESCRIPTIONS, STAGE_LABELS
from tools.bench.systems.guidellm import GuidellmOutcome, cross_check
from tools.bench.systems.scrape import StageMean


def _p(name: str, which: str) -> Callable[[Summary], float | None]:
    def get(summary: Summary) -> float | None:
        dist: Distribution | None = getattr(summary, name)
        return None if dist is None else float(getattr(dist, which))

    return get


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    get: Callable[[Summary], float | None]
    higher_is_better: bool = False


METRICS = (
    Metric("ttft_p50_ms", "TTFT p50", _p("ttft_ms", "p50")),
    Metric("ttft_p99_ms", "TTFT p99", _p("ttft_ms", "p99")),
    Metric("tpot_p50_ms", "TPOT p50", _p("tpot_ms", "p50")),
    Metric("itl_p50_ms", "ITL p50", _p("itl_ms", "p50")),
    Metric("itl_p99_ms", "ITL p99", _p("itl_ms", "p99")),
    Metric("e2e_p50_ms", "E2E p50", _p("e2e_ms", "p50")),
    Metric("output_tok_s", "out tok/s", lambda s: s.output_throughput, higher_is_better=True),
    Metric("req_s", "req/s", lambda s: s.request_throughput, higher_is_better=True),
)


@dataclass(frozen=True)
class SystemOutcome:
    """What one system did on one workload (summary None: it did not run; see error)."""

    system: str
    description: str
    summary: Summary | None
    stages: dict[str, StageMean] = field(default_factory=dict)
    stage_notes: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    guidellm: GuidellmOutcome | None = None
    # Goodput (req/s) at each SLO pair, by SloPair.key (rounds.py); CPU seconds by process
    # role over the measured run (tools/bench/proc_cpu.py).
    goodput: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)

    def values(self) -> dict[str, float | None]:
        if self.summary is None or self.summary.completed == 0:
            return {m.key: None for m in METRICS}
        return {m.key: m.get(self.summary) for m in METRICS}


@dataclass(frozen=True)
class Ratio:
    system: str  # a Cleave system
    peer: str
    metric: str
    value: float | None  # system / peer; None when either is missing or the peer's is 0
    system_value: float | None
    peer_value: float | None


def ratios(outcomes: Sequence[SystemOutcome]) -> list[Ratio]:
    """Every Cleave system against every other system, metric by metric: Cleave / peer."""
    found = []
    values = {o.system: o.values() for o in outcomes}
    for outcome in outcomes:
        if not outcome.system.startswith(CLEAVE_PREFIX):
            continue
        for peer in outcomes:
            if peer.system == outcome.system:
                continue
            for metric in METRICS:
                mine, theirs = values[outcome.system][metric.key], values[peer.system][metric.key]
                value = mine / theirs if mine is not None and theirs else None
                found.append(Ratio(outcome.system, peer.system, metric.key, value, mine, theirs))
    return found


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _stage_cell(outcome: SystemOutcome, key: str) -> str:
    if key in outcome.stages:
        stage = outcome.stages[key]
        return "no samples" if stage.mean_ms is None else f"{stage.mean_ms:.1f} (n={stage.count})"
    note = outcome.stage_notes.get(key, "")
    return "n/a" if note.startswith("n/a") else "not measured" if note else "–"


def _results_table(outcomes: Sequence[SystemOutcome]) -> list[str]:
    stage_keys = list(STAGE_DESCRIPTIONS)
    header = [
        "system",
        "ok/sent",
        *(m.label for m in METRICS),
        *(f"{STAGE_LABELS[k]} ms" for k in stage_keys),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for outcome in outcomes:
        if outcome.summary is None:
            cells = [outcome.system, "failed", *("–" for _ in METRICS), *("–" for _ in stage_keys)]
        else:
            values = outcome.values()
            cells = [
                outcome.system,
                f"{outcome.summary.completed}/{outcome.summary.requests}",
                *(_num(values[m.key], 2 if m.higher_is_better else 1) for m in METRICS),
                *(_stage_cell(outcome, key) for key in stage_keys),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ratio_table(found: Sequence[Ratio]) -> list[str]:
    pairs = list(dict.fromkeys((r.system, r.peer) for r in found))
    if not pairs:
        return ["(no Cleave system and peer both ran)"]
    by_pair = {(r.system, r.peer, r.metric): r for r in found}
    header = ["Cleave ÷ peer", *(m.label for m in METRICS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, peer in pairs:
        cells = [f"{system} ÷ {peer}", *(_num(by_pair[(system, peer, m.key)].value, 2) for m in METRICS)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _guidellm_table(outcomes: Sequence[SystemOutcome]) -> list[str]:
    runs = [(o, o.guidellm) for o in outcomes if o.guidellm is not None]
    if not runs:
        return []
    lines = [
        "",
        "## GuideLLM cross-check",
        "",
        "Medians of successful requests, ms. GuideLLM's ITL is each request's mean gap, i.e. tools/bench's"
        " TPOT; Δ = (GuideLLM − tools/bench) / tools/bench; ⚠ marks |Δ| > 10%.",
        "",
        "| system | TTFT p50 bench | TTFT p50 GuideLLM | Δ | TPOT p50 bench | ITL p50 GuideLLM | Δ | GuideLLM ok/errored |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for outcome, check in runs:
        result = check.result
        if result is None or outcome.summary is None:
            reason = (check.error or "no tools/bench result").splitlines()[0].replace("|", "/")
            lines.append(f"| {outcome.system} | {reason} |" + " – |" * 6)
            continue
        cells = [outcome.system]
        for pair in cross_check(outcome.summary, result):
            diff = pair.difference
            mark = " ⚠" if pair.flagged else ""
            cells += [
                _num(pair.bench_ms),
                _num(pair.guidellm_ms),
                f"{_num(None if diff is None else diff * 100)}%{mark}",
            ]
        cells.append(f"{result.successful}/{result.errored}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(workload: str, description: str, config: BenchConfig, outcomes: Sequence[SystemOutcome]) -> str:
    w = config.workload
    lines = [
        f"# {workload}",
        "",
        f"{description}.",
        "",
        f"tools/bench: `{w.name}` workload, {config.api} API, {describe_arrival(config)}, {config.num_requests} requests"
        f" (+{config.warmup_requests} warmup), seed {config.seed}, max_tokens {w.output_len} with ignore_eos,"
        f" temperature {config.temperature:g}.",
        "",
        "Latencies in ms (TTFT: to the first content chunk; TPOT: (E2E − TTFT) / (tokens − 1) per request;"
        " ITL: every gap between content chunks; E2E: whole request). Stage columns: mean ms over the run.",
        "",
        *_results_table(outcomes),
        "",
        "## Ratios",
        "",
        "Cleave ÷ peer: below 1 is better for latencies, above 1 for throughput.",
        "",
        *_ratio_table(ratios(outcomes)),
        "",
        "## Stages",
        "",
        *(f"- {STAGE_LABELS[key]} (`{key}`): {text}" for key, text in STAGE_DESCRIPTIONS.items()),
    ]
    for outcome in outcomes:
        notes = [f"{key}: {note}" for key, note in outcome.stage_notes.items() if not note.startswith("n/a")]
        if notes:
            lines.append(f"- {outcome.system}: " + "; ".join(notes))
    lines += _guidellm_table(outcomes)
    lines += ["", "## Systems", ""]
    for outcome in outcomes:
        lines.append(f"- **{outcome.system}**: {outcome.description}")
        if outcome.error:
            lines.append(f"  - error: `{outcome.error.splitlines()[0]}` (details in the JSON)")
        if outcome.summary is not None and outcome.summary.error_messages:
            lines += [f"  - request error: `{m}`" for m in outcome.summary.error_messages]
    return "\n".join(lines) + "\n"


def _stage_json(outcome: SystemOutcome) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in STAGE_DESCRIPTIONS:
        if key in outcome.stages:
            found[key] = dataclasses.asdict(outcome.stages[key])
        else:
            found[key] = {"mean_ms": None, "count": 0, "note": outcome.stage_notes.get(key)}
    return found


def workload_json(
    workload: str, config: BenchConfig, outcomes: Sequence[SystemOutcome], meta: dict[str, Any]
) -> dict[str, Any]:
    bench = dataclasses.asdict(config)
    bench.pop("api_key", None)
    bench.pop("url", None)  # each system has its own
    systems: dict[str, Any] = {}
    for outcome in outcomes:
        entry: dict[str, Any] = {
            "description": outcome.description,
            "error": outcome.error,
            "metrics": outcome.values(),
            "summary": None if outcome.summary is None else dataclasses.asdict(outcome.summary),
            "stages": _stage_json(outcome),
            "guidellm": None,
        }
        if outcome.guidellm is not None:
            g = outcome.guidellm
            entry["guidellm"] = {
                "result": None if g.result is None else dataclasses.asdict(g.result),
                "error": g.error,
                "report": str(g.report_path),
                "log": str(g.log_path),
                "cross_check": []
                if g.result is None or outcome.summary is None
                else [
                    {
                        "metric": c.metric,
                        "bench_ms": c.bench_ms,
                        "guidellm_ms": c.guidellm_ms,
                        "difference": c.difference,
                        "flagged": c.flagged,
                    }
                    for c in cross_check(outcome.summary, g.result)
                ],
            }
        systems[outcome.system] = entry
    return _finite(
        {
            "workload": workload,
            "meta": meta,
            "bench_config": bench,
            "systems": systems,
            "ratios": [dataclasses.asdict(r) for r in ratios(outcomes)],
        }
    )


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
