"""The live fleet's Observation, from every gateway's Prometheus /metrics.

Per gateway, between two scrapes: arrivals and mean prompt length from
`cleave_gateway_prompt_tokens` (observed once per request when its prompt is known), mean
completion length from `cleave_gateway_completion_tokens`, TTFT and the gaps between tokens
from `cleave_gateway_ttft_seconds` / `cleave_gateway_itl_seconds` (the attainment quantile,
interpolated within buckets as Prometheus' histogram_quantile does), summed over gateways;
the gateways' own queue `cleave_gateway_queue_depth` (requests waiting for admission); and
the workers' engines as each gateway polls them (`cleave_gateway_worker_routable`,
`_running`, `_waiting`, `_kv_cache_usage`, libs/gateway/fleet/worker_metrics.py; a worker
seen by several gateways counts once). A counter that went down (a restarted gateway) counts from zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from libs.config.roles import Role
from libs.planner.state import Observation, RoleLoad


@dataclass(frozen=True)
class Scrape:
    """One gateway's metrics: sample name -> [(labels, value)]."""

    source: str
    samples: dict[str, list[tuple[dict[str, str], float]]]

    @classmethod
    def parse(cls, source: str, text: str) -> Scrape:
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
        return cls(source, samples)

    def value(self, name: str, default: float = 0.0) -> float:
        return sum(v for _, v in self.samples.get(name, [])) if name in self.samples else default

    def buckets(self, name: str) -> dict[float, float]:
        """A histogram's cumulative bucket counts by upper bound."""
        return {
            float(labels["le"]): v for labels, v in self.samples.get(f"{name}_bucket", []) if "le" in labels
        }

    def by_worker(self, name: str) -> dict[tuple[str, str], float]:
        return {
            (labels.get("worker", ""), labels.get("role", "")): v for labels, v in self.samples.get(name, [])
        }


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative counts by upper bound (None if empty)."""
    bounds = sorted(buckets)
    if not bounds:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the open bucket: its lower bound, as Prometheus
            span = count - below
            return lower + (bound - lower) * ((rank - below) / span if span > 0 else 1.0)
        lower, below = bound, count
    return lower


def _delta(now: float, before: float | None) -> float:
    """Counter increase; a counter that went down restarted from zero."""
    if before is None or now < before:
        return now
    return now - before


@dataclass
class _Previous:
    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


class FleetObserver:
    """Turns successive scrapes of every gateway into windows (keeps each gateway's last)."""

    HISTOGRAMS = ("cleave_gateway_ttft_seconds", "cleave_gateway_itl_seconds")
    COUNTERS = (
        "cleave_gateway_prompt_tokens_count",
        "cleave_gateway_prompt_tokens_sum",
        "cleave_gateway_completion_tokens_count",
        "cleave_gateway_completion_tokens_sum",
    )

    def __init__(self, quantile: float) -> None:
        self.quantile = quantile
        self._previous: dict[str, _Previous] = {}
        self._last_time: float | None = None

    def observe(
        self,
        now: float,
        scrapes: Iterable[Scrape],
        starting: dict[Role, int] | None = None,
        retiring: dict[Role, int] | None = None,
    ) -> Observation:
        scrapes = list(scrapes)
        window = now - self._last_time if self._last_time is not None else 0.0
        first = self._last_time is None
        self._last_time = now
        sums = dict.fromkeys(self.COUNTERS, 0.0)
        histograms: dict[str, dict[float, float]] = {name: {} for name in self.HISTOGRAMS}
        for scrape in scrapes:
            previous = self._previous.setdefault(scrape.source, _Previous())
            for name in self.COUNTERS:
                value = scrape.value(name)
                sums[name] += _delta(value, previous.values.get(name))
                previous.values[name] = value
            for name in self.HISTOGRAMS:
                buckets = scrape.buckets(name)
                before = previous.buckets.get(name, {})
                for bound, count in buckets.items():
                    histograms[name][bound] = histograms[name].get(bound, 0.0) + _delta(
                        count, before.get(bound)
                    )
                previous.buckets[name] = buckets
        arrivals = sums["cleave_gateway_prompt_tokens_count"]
        completions = sums["cleave_gateway_completion_tokens_count"]
        roles = _roles(scrapes, starting or {}, retiring or {})
        if first or window <= 0:
            # The first scrape only sets the baseline: no window to divide by.
            return Observation(
                now=now, window_s=0.0, arrival_rate=0.0, queue_depth=_queue(scrapes), roles=roles
            )
        return Observation(
            now=now,
            window_s=window,
            arrival_rate=arrivals / window,
            isl_mean=sums["cleave_gateway_prompt_tokens_sum"] / arrivals if arrivals else None,
            osl_mean=sums["cleave_gateway_completion_tokens_sum"] / completions if completions else None,
            ttft_q=histogram_quantile(self.quantile, histograms["cleave_gateway_ttft_seconds"]),
            itl_q=histogram_quantile(self.quantile, histograms["cleave_gateway_itl_seconds"]),
            queue_depth=_queue(scrapes),
            roles=roles,
        )


def _queue(scrapes: list[Scrape]) -> int:
    return round(sum(s.value("cleave_gateway_queue_depth") for s in scrapes))


def _roles(
    scrapes: list[Scrape], starting: dict[Role, int], retiring: dict[Role, int]
) -> dict[Role, RoleLoad]:
    """Each role's workers as the gateways poll them; a worker counts once (its highest
    reading), and is ready when some gateway routes to it."""

    def merged(name: str) -> dict[tuple[str, str], float]:
        values: dict[tuple[str, str], float] = {}
        for scrape in scrapes:
            for key, value in scrape.by_worker(name).items():
                values[key] = max(values.get(key, value), value)
        return values

    routable = merged("cleave_gateway_worker_routable")
    running = merged("cleave_gateway_worker_running")
    waiting = merged("cleave_gateway_worker_waiting")
    usage = merged("cleave_gateway_worker_kv_cache_usage")
    loads: dict[Role, RoleLoad] = {}
    for role in Role:
        ready = [key for key, state in routable.items() if key[1] == role.value and state > 0]
        loads[role] = RoleLoad(
            ready=len(ready),
            starting=starting.get(role, 0),
            retiring=retiring.get(role, 0),
            running=round(sum(running.get(key, 0.0) for key in ready)),
            waiting=round(sum(waiting.get(key, 0.0) for key in ready)),
            kv_usage=sum(usage.get(key, 0.0) for key in ready) / len(ready) if ready else 0.0,
        )
    return loads
