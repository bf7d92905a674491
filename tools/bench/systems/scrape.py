"""Prometheus histograms scraped before and after a run: the mean of what the run observed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class HistogramProbe:
    key: str  # the number's name in the reports, e.g. "prefill_stage_ms"
    source: str  # which of the system's /metrics endpoints
    name: str  # the histogram's family name, e.g. "vllm:nixl_xfer_time_seconds"
    labels: Mapping[str, str] = field(default_factory=dict)  # samples must carry these


@dataclass(frozen=True)
class HistogramTotals:
    sum: float
    count: float


@dataclass(frozen=True)
class StageMean:
    mean_ms: float | None  # None: nothing observed during the run
    count: int


def histogram_totals(text: str, probe: HistogramProbe) -> HistogramTotals:
    """The histogram's _sum and _count, added over every label set matching the probe's labels
    (vLLM labels by model and engine); zeros when the histogram is absent."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != probe.name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in probe.labels.items()):
                continue
            if sample.name == f"{probe.name}_sum":
                total += sample.value
            elif sample.name == f"{probe.name}_count":
                count += sample.value
    return HistogramTotals(total, count)


def stage_mean(before: str, after: str, probe: HistogramProbe) -> StageMean:
    """Mean (ms) of the observations made between two scrapes of the same endpoint."""
    first, last = histogram_totals(before, probe), histogram_totals(after, probe)
    count = last.count - first.count
    if count <= 0:
        return StageMean(None, 0)
    return StageMean((last.sum - first.sum) / count * 1000.0, round(count))


async def scrape(client: httpx.AsyncClient, urls: Mapping[str, str]) -> dict[str, str]:
    """Every endpoint's exposition text; an unreachable endpoint gives "" (no observations)."""
    texts = {}
    for source, url in urls.items():
        try:
            response = await client.get(url, timeout=10.0)
            texts[source] = response.text if response.status_code == httpx.codes.OK else ""
        except httpx.HTTPError:
            texts[source] = ""
    return texts
