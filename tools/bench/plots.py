"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from tools.bench.runner import BenchResult
from tools.bench.stats import Distribution, Summary

# No display: plots only ever go to files. (Switching is fine before any figure exists.)
matplotlib.use("Agg")


def _label(result: BenchResult) -> str:
    config = result.config
    return f"concurrency {config.concurrency}" if config.rate is None else f"{config.rate:g} req/s"


def _cdf(ax: Axes, values_ms: Sequence[float], label: str) -> None:
    if not values_ms:
        return
    xs = np.sort(np.asarray(values_ms))
    ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=label)


def latency_cdfs(results: Sequence[BenchResult], path: Path) -> None:
    """TTFT, ITL and E2E CDFs side by side, one line per run."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for result in results:
        ok = [r for r in result.records if r.ok]
        label = _label(result)
        _cdf(axes[0], [r.ttft_s * 1000 for r in ok if r.ttft_s is not None], label)
        _cdf(axes[1], [gap * 1000 for r in ok for gap in r.itl_s], label)
        _cdf(axes[2], [r.e2e_s * 1000 for r in ok if r.e2e_s is not None], label)
    for ax, title in zip(axes, ("TTFT", "ITL", "E2E latency"), strict=True):
        ax.set(
            title=title, xlabel="ms", ylabel="fraction of requests" if title != "ITL" else "fraction of gaps"
        )
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _swept(results: Sequence[BenchResult]) -> list[BenchResult]:
    return [r for r in results if r.config.rate is not None and math.isfinite(r.config.rate)]


def _percentile(dist: Distribution | None, which: str) -> float:
    return float(getattr(dist, which)) if dist is not None else math.nan


def rate_sweep(results: Sequence[BenchResult], throughput_path: Path, latency_path: Path) -> None:
    """Achieved throughput and latency percentiles against the offered rate."""
    runs = _swept(results)
    rates = [float(r.config.rate or 0.0) for r in runs]  # all finite rates (_swept)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rates, rates, linestyle=":", color="gray", label="offered")
    ax.plot(rates, [r.summary.request_throughput for r in runs], marker="o", label="completed")
    if any(r.summary.goodput is not None for r in runs):
        ax.plot(rates, [r.summary.goodput or 0.0 for r in runs], marker="s", label="goodput")
    ax.set(title="Throughput vs offered rate", xlabel="offered rate (req/s)", ylabel="req/s")
    tokens = ax.twinx()
    tokens.plot(
        rates, [r.summary.output_throughput for r in runs], marker="^", color="tab:red", label="output tok/s"
    )
    tokens.set_ylabel("output tok/s", color="tab:red")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    token_handles, token_labels = tokens.get_legend_handles_labels()
    ax.legend(handles + token_handles, labels + token_labels, loc="upper left")
    fig.tight_layout()
    fig.savefig(throughput_path, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (title, name) in zip(
        axes, (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")), strict=True
    ):
        for which in ("p50", "p90", "p99"):
            ax.plot(
                rates, [_percentile(getattr(r.summary, name), which) for r in runs], marker="o", label=which
            )
        ax.set(title=f"{title} vs offered rate", xlabel="offered rate (req/s)", ylabel="ms")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(latency_path, dpi=110)
    plt.close(fig)


def write_plots(results: Sequence[BenchResult], folder: Path) -> list[Path]:
    """Writes the plots that the results support; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "latency_cdf.png"]
    latency_cdfs(results, written[0])
    if len(_swept(results)) >= 2:
        written += [folder / "throughput_vs_rate.png", folder / "latency_vs_rate.png"]
        rate_sweep(results, written[1], written[2])
    return written


def throughput_latency(
    series: Mapping[str, Sequence[tuple[float, Summary]]], path: Path, title: str = ""
) -> None:
    """One line per system over a rate sweep: achieved output tok/s against TTFT p50, TTFT p99
    and ITL p99 (tools/bench:compare --sweep-rates). Points are labelled with the offered rate."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("TTFT p50", "ttft_ms", "p50"), ("TTFT p99", "ttft_ms", "p99"), ("ITL p99", "itl_ms", "p99"))
    for ax, (label, name, which) in zip(axes, panels, strict=True):
        for system, points in series.items():
            ordered = sorted(points, key=lambda p: p[0])
            xs = [s.output_throughput for _, s in ordered]
            ys = [_percentile(getattr(s, name), which) for _, s in ordered]
            ax.plot(xs, ys, marker="o", label=system)
            for (rate, _), x, y in zip(ordered, xs, ys, strict=True):
                ax.annotate(f"{rate:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set(title=f"{label} vs throughput", xlabel="output tok/s", ylabel="ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
