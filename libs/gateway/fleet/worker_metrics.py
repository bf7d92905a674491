"""Worker counters re-exported on the gateway's /metrics, from the stats it polls anyway.

Workers export Prometheus only with --metrics-port (the local stack does not pass it), but
the pool polls every worker's GetStats each second; this collector turns the latest polled
values into gateway metrics, so one scrape of the gateway shows the handoff and kvstore
numbers of the whole pool. Values are cumulative since each worker started (a restarted
worker starts again from 0, as a counter would).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from libs.gateway.fleet.pool import Endpoint


class Fleet(Protocol):
    @property
    def endpoints(self) -> Sequence[Endpoint]: ...


class WorkerStatsCollector(Collector):
    def __init__(self, pool: Fleet) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        endpoints = self._pool.endpoints
        yield SummaryMetricFamily(
            "cleave_gateway_worker_kv_pull_seconds",
            "NIXL handoff reads by the decode workers, timed by NIXL's telemetry (all workers)",
            count_value=sum(e.stats.kv_pulls.transfers for e in endpoints),
            sum_value=sum(e.stats.kv_pulls.seconds for e in endpoints),
        )
        loaded = CounterMetricFamily(
            "cleave_gateway_worker_kvstore_tokens_loaded",
            "Prompt tokens each worker loaded from the kvstore instead of computing them",
            labels=["worker", "role"],
        )
        for e in endpoints:
            loaded.add_metric([e.address, e.role], e.stats.kvstore.tokens_loaded)
        yield loaded
        yield from _load(endpoints)
        yield from _spec_decode(endpoints)
        yield _cached_blocks(endpoints)


def _cached_blocks(endpoints: Sequence[Endpoint]) -> Metric:
    """What each followed worker's KV events say its engine caches (--routing kv_events)."""
    family = GaugeMetricFamily(
        "cleave_gateway_worker_kv_cached_blocks",
        "Prefix-cache blocks the worker's engine holds, from its KV events (workers whose events "
        "this gateway follows and currently hears)",
        labels=["worker", "role"],
    )
    for e in endpoints:
        if e.cached_blocks is not None:
            family.add_metric([e.address, e.role], len(e.cached_blocks))
    return family


def _load(endpoints: Sequence[Endpoint]) -> Iterator[Metric]:
    """Each worker's load as last polled, and whether this gateway routes to it: what a fleet
    planner (libs/planner/observe.py) sizes the fleet from. Retired workers are not listed."""
    labels = ["worker", "role"]
    families = {
        "routable": GaugeMetricFamily(
            "cleave_gateway_worker_routable",
            "1 while this gateway routes new requests to the worker (its breaker closed), else 0",
            labels=labels,
        ),
        "admitted": GaugeMetricFamily(
            "cleave_gateway_worker_admitted", "This gateway's requests in flight on the worker", labels=labels
        ),
        "running": GaugeMetricFamily(
            "cleave_gateway_worker_running",
            "Sequences running in the worker's engine (polled)",
            labels=labels,
        ),
        "waiting": GaugeMetricFamily(
            "cleave_gateway_worker_waiting",
            "Sequences waiting in the worker's engine (polled)",
            labels=labels,
        ),
        "kv_cache_usage": GaugeMetricFamily(
            "cleave_gateway_worker_kv_cache_usage",
            "Fraction of the worker's KV blocks in use, 0..1 (polled)",
            labels=labels,
        ),
    }
    for e in endpoints:
        key = [e.address, e.role]
        families["routable"].add_metric(key, 1.0 if e.healthy else 0.0)
        families["admitted"].add_metric(key, e.admitted)
        families["running"].add_metric(key, e.stats.num_running)
        families["waiting"].add_metric(key, e.stats.num_waiting)
        families["kv_cache_usage"].add_metric(key, e.stats.kv_cache_usage)
    yield from families.values()


def _spec_decode(endpoints: Sequence[Endpoint]) -> Iterator[Metric]:
    """Speculative decoding per worker that has drafted (--decode-speculative-config)."""
    speculating = [e for e in endpoints if e.stats.spec_decode.drafts]
    labels = ["worker", "role"]
    counts = {
        name: CounterMetricFamily(f"cleave_gateway_worker_spec_decode_{name}", text, labels=labels)
        for name, text in (
            ("drafts", "Draft proposals verified (one per sequence and step)"),
            ("draft_tokens", "Tokens the drafter proposed"),
            ("accepted_tokens", "Proposed tokens the target model accepted"),
        )
    }
    rate = GaugeMetricFamily(
        "cleave_gateway_worker_spec_decode_acceptance_rate",
        "Accepted / drafted speculative tokens since the worker started, 0..1",
        labels=labels,
    )
    length = GaugeMetricFamily(
        "cleave_gateway_worker_spec_decode_mean_accepted_length",
        "Tokens per verification step and sequence since the worker started: 1 + accepted / drafts",
        labels=labels,
    )
    for e in speculating:
        spec = e.stats.spec_decode
        for name, family in counts.items():
            family.add_metric([e.address, e.role], getattr(spec, name))
        rate.add_metric([e.address, e.role], spec.acceptance_rate)
        length.add_metric([e.address, e.role], spec.mean_accepted_length)
    yield from counts.values()
    yield rate
    yield length
