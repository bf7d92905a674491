"""A worker's drain (libs/worker/drain.py) against the in-memory engine: new requests refused
with the draining marker, running ones finished, what the deadline leaves handed off."""

from __future__ import annotations

import asyncio

import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.rpc import draining
from libs.worker.config import WorkerConfig
from libs.worker.drain import WorkerDraining, handoff_time
from libs.worker.service import WorkerService
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    role: Role, token_delay_s: float = 0.0, clock: Clock | None = None
) -> tuple[WorkerService, FakeEngine]:
    engine = FakeEngine(token_delay_s=token_delay_s)
    config = WorkerConfig(role=role, model="/nonexistent", served_model_name="fake", kv_lease_s=30)
    return WorkerService(config, engine, address="127.0.0.1:1", clock=clock or Clock()), engine


def generate_request(request_id: str, max_tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id=request_id),
        prompt_token_ids=[5, 6, 7],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
    )


async def tokens_of(service: WorkerService, request: worker_pb2.GenerateRequest) -> list[int]:
    tokens: list[int] = []
    async for response in service.generate(request):
        if response.HasField("chunk"):
            tokens.extend(response.chunk.token_ids)
    return tokens


def deadline_in(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_running_requests_finish_and_new_ones_are_refused_as_draining() -> None:
    service, _engine = make(Role.DECODE, token_delay_s=0.01)
    running = asyncio.create_task(tokens_of(service, generate_request("r1", 30)))
    await asyncio.sleep(0.05)  # a few tokens in
    started = asyncio.get_running_loop().time()
    drain = asyncio.create_task(service.drain(deadline_in(10)))
    await asyncio.sleep(0)
    assert service.draining
    with pytest.raises(WorkerDraining) as refused:
        await tokens_of(service, generate_request("r2", 5))
    assert draining.is_draining(str(refused.value))
    assert await running == list(range(8, 38))  # every token, none lost
    await drain
    # It returned once the request ended, not at its deadline.
    assert asyncio.get_running_loop().time() - started < 5


async def test_what_the_deadline_leaves_is_handed_off_and_aborted_in_the_engine() -> None:
    service, engine = make(Role.DECODE, token_delay_s=0.05)  # 60 tokens: 3 s
    running = asyncio.create_task(tokens_of(service, generate_request("long", 60)))
    await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    await service.drain(deadline_in(1.0))
    with pytest.raises(WorkerDraining) as handed_off:
        await running
    assert draining.is_draining(str(handed_off.value)) and "continue it elsewhere" in str(handed_off.value)
    assert "long" in engine.aborted
    elapsed = asyncio.get_running_loop().time() - started
    # Handed off at the hand-off time (a fifth of the second before the deadline), done by it.
    assert 0.7 < elapsed < 1.1, elapsed


async def test_a_prefill_worker_waits_for_its_handed_over_kv_until_the_lease_ends() -> None:
    clock = Clock()
    service, _engine = make(Role.PREFILL, clock=clock)
    response = await service.prefill(
        worker_pb2.PrefillRequest(
            metadata=common_pb2.RequestMetadata(request_id="p1"), prompt_token_ids=[5, 6, 7]
        )
    )
    assert response.HasField("handoff")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await service.drain(deadline_in(0.5))  # the lease (30 s of the fake clock) outlives it
    assert loop.time() - started > 0.35

    expired, _ = make(Role.PREFILL, clock=clock)
    await expired.prefill(
        worker_pb2.PrefillRequest(metadata=common_pb2.RequestMetadata(request_id="p2"), prompt_token_ids=[5])
    )
    clock.now += 31  # the decode worker had its time to pull
    started = loop.time()
    await expired.drain(deadline_in(5))
    assert loop.time() - started < 0.5


async def test_a_prefill_worker_stops_waiting_once_its_engine_has_freed_the_kv() -> None:
    service, engine = make(Role.PREFILL, clock=Clock())
    await service.prefill(
        worker_pb2.PrefillRequest(metadata=common_pb2.RequestMetadata(request_id="p1"), prompt_token_ids=[5])
    )
    assert service.stats().num_leased == 1
    # The decode pulled the KV; vLLM freed the blocks and says so in its next stats.
    engine.stats().kv_cache_usage = 0.0
    engine.stats().updates += 1
    loop = asyncio.get_running_loop()
    started = loop.time()
    await service.drain(deadline_in(5))
    assert loop.time() - started < 0.5
    assert service.stats().num_leased == 0


def test_the_hand_off_keeps_a_fifth_of_the_drain_at_most_three_seconds() -> None:
    assert handoff_time(0.0, 50.0) == 47.0
    assert handoff_time(0.0, 5.0) == 4.0
    assert handoff_time(10.0, 5.0) == 5.0  # already past: hand off now
