"""`tools/bench:compare --sweep-rates`: every workload open loop at each offered rate, every
system; a table and throughput-latency plots (tools/bench/plots.py) per workload. With
several rounds a point is the median over the rounds of each number."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tools.bench.stats import Distribution, Summary


@dataclass(frozen=True)
class SweepPoint:
    workload: str
    system: str
    rate: float
    round: int
    summary: Summary | None  # None: the run failed
    goodput: dict[str, float]


def _median_dist(dists: Sequence[Distribution | None]) -> Distribution | None:
    found = [d for d in dists if d is not None]
    if not found:
        return None
    return Distribution(
        count=int(statistics.median(d.count for d in found)),
        mean=statistics.median(d.mean for d in found),
        p50=statistics.median(d.p50 for d in found),
        p90=statistics.median(d.p90 for d in found),
        p99=statistics.median(d.p99 for d in found),
    )


def median_summary(summaries: Sequence[Summary]) -> Summary:
    """Field-wise median of several rounds' summaries (the first one's error list)."""
    first = summaries[0]
    numbers = {
        name: statistics.median(getattr(s, name) for s in summaries)
        for name in ("duration_s", "request_throughput", "output_throughput", "total_token_throughput")
    }
    return replace(
        first,
        **numbers,
        ttft_ms=_median_dist([s.ttft_ms for s in summaries]),
        tpot_ms=_median_dist([s.tpot_ms for s in summaries]),
        itl_ms=_median_dist([s.itl_ms for s in summaries]),
        e2e_ms=_median_dist([s.e2e_ms for s in summaries]),
    )


def series(points: Sequence[SweepPoint], workload: str) -> dict[str, list[tuple[float, Summary]]]:
    """system -> [(rate, median summary over rounds)] for one workload (failed runs left out)."""
    found: dict[str, dict[float, list[Summary]]] = {}
    for p in points:
        if p.workload == workload and p.summary is not None and p.summary.completed > 0:
            found.setdefault(p.system, {}).setdefault(p.rate, []).append(p.summary)
    return {
        system: [(rate, median_summary(runs)) for rate, runs in sorted(by_rate.items())]
        for system, by_rate in found.items()
    }


def _ms(dist: Distribution | None, which: str) -> str:
    return "–" if dist is None else f"{getattr(dist, which):.0f}"


def markdown(points: Sequence[SweepPoint], workload: str, goodput_labels: dict[str, str]) -> str:
    lines = [
        f"# {workload}: rate sweep",
        "",
        "Open loop (Poisson arrivals) at each offered rate; medians over the rounds. Plot:"
        f" `{workload}.sweep.png`.",
        "",
        "| system | offered req/s | ok/sent | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | "
        + " | ".join(f"goodput {label}" for label in goodput_labels.values())
        + " |",
        "|" + "---|" * (8 + len(goodput_labels)),
    ]
    for system, runs in series(points, workload).items():
        for rate, s in runs:
            good = [
                statistics.median(
                    p.goodput.get(key, 0.0)
                    for p in points
                    if p.workload == workload and p.system == system and p.rate == rate and p.summary
                )
                for key in goodput_labels
            ]
            cells = [system, f"{rate:g}", f"{s.completed}/{s.requests}", f"{s.output_throughput:.1f}",
                     _ms(s.ttft_ms, "p50"), _ms(s.ttft_ms, "p99"), _ms(s.itl_ms, "p50"), _ms(s.itl_ms, "p99"),
                     *(f"{g:.3f}" for g in good)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    failed = [p for p in points if p.workload == workload and (p.summary is None or p.summary.completed == 0)]
    lines += [f"- failed: {p.system} at {p.rate:g} req/s (round {p.round + 1})" for p in failed]
    return "\n".join(lines) + "\n"


def write(
    points: Sequence[SweepPoint], workloads: Sequence[str], out_dir: Path, goodput_labels: dict[str, str]
) -> list[Path]:
    from tools.bench.plots import throughput_latency  # matplotlib: only when a sweep ran

    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        md = out_dir / f"{workload}.sweep.md"
        md.write_text(markdown(points, workload, goodput_labels))
        written.append(md)
        data = series(points, workload)
        if data:
            png = out_dir / f"{workload}.sweep.png"
            throughput_latency(data, png, title=f"{workload}: rate sweep")
            written.append(png)
    return written
