"""The gateway re-exports polled worker counters: one scrape shows the pool's KV pulls."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.worker_metrics import WorkerStatsCollector
from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate
from tools.bench.systems.scrape import HistogramProbe, stage_mean


class FakePool:
    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints


def endpoint(address: str, role: str, stats: worker_pb2.WorkerStats) -> Endpoint:
    unused: Any = None
    return Endpoint(address, Role(role), channel=unused, stub=unused, healthy=True, stats=stats)


def test_kv_pulls_scrape_as_a_summary_the_bench_can_difference() -> None:
    decode = endpoint(
        "d:1", "decode", worker_pb2.WorkerStats(kv_pulls=worker_pb2.KvPullStats(transfers=2, seconds=0.04))
    )
    prefill = endpoint(
        "p:1", "prefill", worker_pb2.WorkerStats(kvstore=worker_pb2.KvStoreConnectorStats(tokens_loaded=512))
    )
    registry = CollectorRegistry()
    registry.register(WorkerStatsCollector(FakePool([decode, prefill])))
    before = generate_latest(registry).decode()
    decode.stats = worker_pb2.WorkerStats(kv_pulls=worker_pb2.KvPullStats(transfers=5, seconds=0.10))
    after = generate_latest(registry).decode()
    mean = stage_mean(
        before, after, HistogramProbe("kv_transfer_ms", "gateway", "cleave_gateway_worker_kv_pull_seconds")
    )
    assert mean.count == 3 and abs((mean.mean_ms or 0) - 20.0) < 1e-6
    assert 'cleave_gateway_worker_kvstore_tokens_loaded_total{role="prefill",worker="p:1"} 512.0' in after


def test_spec_decode_of_speculating_workers_is_re_exported() -> None:
    spec = worker_pb2.SpecDecodeStats(
        drafts=4, draft_tokens=20, accepted_tokens=10, acceptance_rate=0.5, mean_accepted_length=3.5
    )
    decode = endpoint("d:1", "decode", worker_pb2.WorkerStats(spec_decode=spec))
    prefill = endpoint("p:1", "prefill", worker_pb2.WorkerStats())
    registry = CollectorRegistry()
    registry.register(WorkerStatsCollector(FakePool([decode, prefill])))
    text = generate_latest(registry).decode()
    assert 'cleave_gateway_worker_spec_decode_accepted_tokens_total{role="decode",worker="d:1"} 10.0' in text
    assert 'cleave_gateway_worker_spec_decode_acceptance_rate{role="decode",worker="d:1"} 0.5' in text
    assert 'cleave_gateway_worker_spec_decode_mean_accepted_length{role="decode",worker="d:1"} 3.5' in text
    assert 'worker="p:1"' not in text.split("cleave_gateway_worker_spec_decode", 1)[1]


def test_the_blocks_each_followed_worker_caches_are_exported() -> None:
    followed = endpoint("a:1", "prefill", worker_pb2.WorkerStats())
    followed.cached_blocks = CachedBlocks()
    followed.cached_blocks.apply(KvCacheUpdate(stored=(1, 2, 3)))
    unknown = endpoint("b:1", "prefill", worker_pb2.WorkerStats())  # not followed, or not heard
    registry = CollectorRegistry()
    registry.register(WorkerStatsCollector(FakePool([followed, unknown])))
    text = generate_latest(registry).decode()
    assert 'cleave_gateway_worker_kv_cached_blocks{role="prefill",worker="a:1"} 3.0' in text
    assert 'cleave_gateway_worker_kv_cached_blocks{role="prefill",worker="b:1"}' not in text
