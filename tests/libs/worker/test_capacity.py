"""The worker's own bound on running requests (libs/worker/capacity.py), against the in-memory
engine: one more than the bound is refused before it runs, with the at-capacity marker; the
count and the bound are reported; a refused request runs once room frees."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.rpc import at_capacity
from libs.rpc.errors import AtCapacity, classify
from libs.worker.capacity import InflightRequests
from libs.worker.config import WorkerConfig
from libs.worker.service import WorkerService
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


def make(role: Role, **config: int) -> tuple[WorkerService, FakeEngine]:
    engine = FakeEngine(token_delay_s=0.01)
    worker = WorkerConfig(role=role, model="/nonexistent", served_model_name="fake", **config)  # type: ignore[arg-type]
    return WorkerService(worker, engine, address="127.0.0.1:1"), engine


def request(request_id: str, max_tokens: int = 20) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id=request_id),
        prompt_token_ids=[5, 6, 7],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
    )


async def tokens(service: WorkerService, generate: worker_pb2.GenerateRequest) -> int:
    return sum([len(r.chunk.token_ids) async for r in service.generate(generate) if r.HasField("chunk")])


async def test_one_request_past_the_bound_is_refused_before_it_runs_and_runs_once_room_frees() -> None:
    service, engine = make(Role.DECODE, max_inflight_requests=2)
    assert service.info().max_inflight_requests == 2
    running = [asyncio.create_task(tokens(service, request(f"r{i}"))) for i in range(2)]
    await asyncio.sleep(0.03)
    assert service.num_inflight == 2 and service.stats().num_inflight == 2
    with pytest.raises(AtCapacity) as refused:
        await tokens(service, request("r2"))
    failure = classify(refused.value, "worker")
    assert at_capacity.is_at_capacity(failure.status, failure.message)
    assert all(call["request_id"] != "r2" for call in engine.calls)  # nothing of it reached the engine
    assert await asyncio.gather(*running) == [20, 20]
    assert service.num_inflight == 0
    assert await tokens(service, request("r2")) == 20


def test_the_count_admits_up_to_its_bound_and_frees_on_discard() -> None:
    inflight = InflightRequests(1)
    inflight.admit("held")
    with pytest.raises(AtCapacity):
        inflight.admit("next")
    inflight.discard("held")
    inflight.admit("next")
    assert len(inflight) == 1 and "next" in inflight
    with pytest.raises(ValueError):
        InflightRequests(0)


def test_the_default_bound_is_twice_the_engines_batch() -> None:
    service, engine = make(Role.BOTH, max_num_seqs=3)
    assert service.info().max_inflight_requests == 2 * (engine.info.scheduler.max_num_seqs or 3)


def test_a_plain_resource_exhausted_is_not_an_at_capacity_refusal() -> None:
    assert not at_capacity.is_at_capacity(grpc.StatusCode.RESOURCE_EXHAUSTED, "message too large")
    assert not at_capacity.is_at_capacity(grpc.StatusCode.UNAVAILABLE, at_capacity.message("x"))
