"""The connector's counters through vLLM's stats plumbing: take-and-reset, aggregation across
steps and processes, and Prometheus export (vLLM's MultiConnector refuses a child's stats
without it, which killed the engine before this existed)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from libs.kvconnector.counters import CounterBox, KvStoreConnectorStats, KvStorePromMetrics
from libs.kvconnector.vllm_connector import CONNECTOR_NAME, KvStoreConnector


def test_counter_box_hands_out_each_count_once() -> None:
    box = CounterBox()
    assert box.take() is None
    box.add(lookups=1, tokens_loaded=256, load_seconds=0.25)
    box.add(lookups=1)
    taken = box.take()
    assert taken is not None and taken.data["lookups"] == 2 and taken.data["tokens_loaded"] == 256
    assert box.take() is None


def test_stats_rebuilt_from_their_serialized_form_aggregate() -> None:
    first = KvStoreConnector.build_kv_connector_stats({"lookups": 1, "tokens_loaded": 512})
    second = KvStoreConnector.build_kv_connector_stats(KvStoreConnectorStats().to_dict() | {"lookups": 2})
    assert first is not None and second is not None
    total = first.aggregate(second)
    assert total.reduce()["lookups"] == 3 and total.reduce()["tokens_loaded"] == 512
    assert not total.is_empty() and KvStoreConnectorStats().is_empty()


def test_prometheus_counters_per_engine() -> None:
    metric_types = {Counter: Counter, Gauge: Gauge, Histogram: Histogram}
    prom = KvStorePromMetrics(
        SimpleNamespace(kv_transfer_config=None), metric_types, ["model_name", "engine"], {0: ["m", "0"]}
    )
    prom.observe({"tokens_loaded": 1792, "lookup_failures": 1, "unknown": 5})
    labels = {"model_name": "m", "engine": "0"}
    assert REGISTRY.get_sample_value("vllm:cleave_kvstore_tokens_loaded_total", labels) == 1792
    assert REGISTRY.get_sample_value("vllm:cleave_kvstore_lookup_failures_total", labels) == 1


def test_the_connector_is_known_by_the_name_multiconnector_uses() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    assert KVConnectorFactory.get_connector_class_by_name(CONNECTOR_NAME) is KvStoreConnector
