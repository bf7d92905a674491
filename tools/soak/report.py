"""The soak's summary: requests and their outcomes, errors by status, hung requests, and the
RSS trend of every process of the stack."""

from __future__ import annotations

from typing import Any

from tools.soak.memory import Series, TreeSampler
from tools.soak.runner import SoakResult


def as_json(result: SoakResult, sampler: TreeSampler | None, warmup_s: float) -> dict[str, Any]:
    options = result.options
    return {
        "url": options.base_url,
        "model": result.model,
        "duration_s": round(result.seconds, 1),
        "concurrency": options.concurrency,
        "stall_s": options.stall_s,
        "seed": options.seed,
        "requests": len(result.outcomes),
        "completed": result.count("completed"),
        "aborted": result.count("aborted"),
        "disconnected_early": sum(1 for o in result.outcomes if o.detail == "disconnected early"),
        "errors": result.count("error"),
        "hung": result.hung,
        "errors_by_status": result.errors_by_detail(),
        "error_examples": result.error_examples(),
        "by_kind": result.by_kind(),
        "checks": result.checks,
        "processes": [_series_json(s, warmup_s, sampler) for s in _ordered(sampler)],
    }


def _ordered(sampler: TreeSampler | None) -> list[Series]:
    return sorted(sampler.series.values(), key=lambda s: (s.label, s.pid)) if sampler else []


def _series_json(series: Series, warmup_s: float, sampler: TreeSampler | None) -> dict[str, Any]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "pid": series.pid,
        "process": series.label,
        "samples": len(series.points),
        "rss_first_mib": round(series.first_mib, 1),
        "rss_last_mib": round(series.last_mib, 1),
        "rss_max_mib": round(series.max_mib, 1),
        "slope_mib_per_min": rounded(series.slope_mib_per_min()),
        "slope_after_warmup_mib_per_min": rounded(series.slope_mib_per_min(after_s=warmup_s)),
        "exited_during_run": bool(sampler) and series.points[-1][0] < _last_sample_s(sampler),
        "rss_mib_by_second": [[round(t, 1), round(mib, 1)] for t, mib in series.points],
    }


def _last_sample_s(sampler: TreeSampler | None) -> float:
    return max((s.points[-1][0] for s in sampler.series.values()), default=0.0) if sampler else 0.0


def as_text(summary: dict[str, Any]) -> str:
    lines = [
        f"soak of {summary['url']} ({summary['model']}): {summary['duration_s']:.0f} s, "
        f"{summary['concurrency']} clients, stall limit {summary['stall_s']:.0f} s",
        f"requests {summary['requests']}: completed {summary['completed']}, aborted by the client "
        f"{summary['aborted']} ({summary['disconnected_early']} before the answer started), "
        f"errors {summary['errors']}, hung {summary['hung']}",
    ]
    if summary["errors_by_status"]:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in summary["errors_by_status"].items()))
        for detail, message in summary["error_examples"].items():
            lines.append(f"  first {detail}: {message}")
    for kind, counts in summary["by_kind"].items():
        lines.append(f"  {kind:22s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for name, verdict in summary["checks"].items():
        lines.append(f"check: {name}: {verdict}")
    if summary["processes"]:
        lines.append(
            f"{'process':60s} {'pid':>7s} {'first':>8s} {'last':>8s} {'max':>8s} {'MiB/min':>8s} {'after warm-up':>13s}"
        )
        for p in summary["processes"]:
            lines.append(
                f"{p['process'][:60]:60s} {p['pid']:7d} {p['rss_first_mib']:8.1f} {p['rss_last_mib']:8.1f} "
                f"{p['rss_max_mib']:8.1f} {_fmt(p['slope_mib_per_min']):>8s} "
                f"{_fmt(p['slope_after_warmup_mib_per_min']):>13s}"
                + ("  (exited)" if p["exited_during_run"] else "")
            )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"
