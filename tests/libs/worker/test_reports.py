"""GetStats and GetInfo from the engine's facts and the worker's config."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.engine import EngineStats, SchedulerLimits
from libs.worker.reports import worker_info, worker_stats
from tests.libs.worker.fake_engine import INFO


def test_stats_carry_the_engines_counters_and_the_services_own() -> None:
    engine = EngineStats(
        num_running=2,
        kv_cache_usage=0.25,
        kvstore={"lookups": 3, "unknown_counter": 1},
        kv_pulls={"transfers": 4, "seconds": 0.5},
        spec_decode={"drafts": 2, "draft_tokens": 6, "accepted_tokens": 3},
    )
    stats = worker_stats(Role.PREFILL, engine, INFO, num_leased=1, requests_aborted=5, num_inflight=3)
    assert stats.role == worker_pb2.ROLE_PREFILL
    assert (stats.num_running, stats.kv_cache_usage, stats.kv_blocks_total) == (2, 0.25, INFO.num_kv_blocks)
    assert (stats.num_leased, stats.requests_aborted, stats.num_inflight) == (1, 5, 3)
    assert stats.kvstore.lookups == 3  # counters the contract does not know are left out
    assert (stats.kv_pulls.transfers, stats.kv_pulls.seconds) == (4, 0.5)
    assert stats.spec_decode.accepted_tokens == 3


def test_info_says_what_the_worker_serves() -> None:
    config = WorkerConfig(role=Role.DECODE, model="/nonexistent", served_model_name="fake", max_num_seqs=8)
    layout = common_pb2.KvLayout(block_size=16)
    info = worker_info(
        config, replace(INFO, sampling_defaults={"max_tokens": 12}), layout, max_inflight_requests=16
    )
    assert info.role == worker_pb2.ROLE_DECODE
    assert (info.model, info.max_model_len, info.max_num_seqs) == ("fake", INFO.max_model_len, 8)
    assert info.kv_layout == layout and info.default_max_tokens == 12 and info.generate_many
    assert info.max_inflight_requests == 16
    assert not worker_info(config, INFO, layout, max_inflight_requests=16).HasField("default_max_tokens")


def test_the_schedulers_limits_are_reported_by_name_the_config_filling_in_what_it_does_not_say() -> None:
    config = WorkerConfig(role=Role.DECODE, model="/nonexistent", max_num_seqs=8)
    layout = common_pb2.KvLayout(block_size=16)
    told = replace(INFO, scheduler=SchedulerLimits(max_num_seqs=5))
    assert worker_info(config, told, layout, max_inflight_requests=16).max_num_seqs == 5
    assert (
        worker_info(config, told, layout, max_inflight_requests=16).max_num_batched_tokens == 0
    )  # not said: unset
    steps = replace(INFO, scheduler=SchedulerLimits(max_num_batched_tokens=512))
    assert worker_info(config, steps, layout, max_inflight_requests=16).max_num_batched_tokens == 512
    silent = replace(INFO, scheduler=SchedulerLimits())
    assert worker_info(config, silent, layout, max_inflight_requests=16).max_num_seqs == 8
    assert SchedulerLimits.of(SimpleNamespace(max_num_seqs=3, other=1)) == SchedulerLimits(max_num_seqs=3)
    assert SchedulerLimits.of(object()) == SchedulerLimits()
