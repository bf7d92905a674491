"""What Cleave's stat logger keeps from vLLM's stats: connector counters from a lone connector
or a MultiConnector, summed across steps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from libs.worker.vllm_stats import CapturingStatLogger


def scheduler_stats(connector_stats: dict[str, Any] | None) -> SimpleNamespace:
    return SimpleNamespace(
        kv_connector_stats=connector_stats, num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.5
    )


NIXL_STEP = {
    "transfer_duration": [0.020, 0.030],
    "post_duration": [0.001, 0.001],
    "bytes_transferred": [1_000_000, 2_000_000],
    "num_descriptors": [4, 4],
    "num_failed_transfers": [1],
}


def test_nixl_pulls_add_up_from_a_lone_connector_and_a_multiconnector() -> None:
    logger = CapturingStatLogger(vllm_config=None)
    logger.record(scheduler_stats(NIXL_STEP), None)
    logger.record(scheduler_stats({"NixlConnector": NIXL_STEP, "KvStoreConnector": {"lookups": 2}}), None)
    pulls = logger.stats.kv_pulls
    assert pulls["transfers"] == 4 and pulls["bytes"] == 6_000_000 and pulls["failures"] == 2
    assert abs(pulls["seconds"] - 0.1) < 1e-9
    assert logger.stats.kvstore == {"lookups": 2}


def test_steps_without_connector_stats_change_nothing() -> None:
    logger = CapturingStatLogger(vllm_config=None)
    logger.record(scheduler_stats(None), None)
    logger.record(scheduler_stats({"SomeOtherConnector": {"x": [1]}}), None)
    assert logger.stats.kv_pulls == {} and logger.stats.kvstore == {}


def test_spec_decode_counts_add_up_over_steps_that_verified_drafts() -> None:
    logger = CapturingStatLogger(vllm_config=None)
    step = scheduler_stats(None)
    step.spec_decoding_stats = SimpleNamespace(num_drafts=2, num_draft_tokens=10, num_accepted_tokens=7)
    logger.record(step, None)
    logger.record(scheduler_stats(None), None)  # no spec_decoding_stats: a step without drafts
    step.spec_decoding_stats = SimpleNamespace(num_drafts=1, num_draft_tokens=5, num_accepted_tokens=0)
    logger.record(step, None)
    assert logger.stats.spec_decode == {"drafts": 3, "draft_tokens": 15, "accepted_tokens": 7}
