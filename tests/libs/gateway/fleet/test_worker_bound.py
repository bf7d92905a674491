"""Per-worker bounds that hold across gateways (libs/gateway/fleet/admission.py with
libs/worker/capacity.py), with in-memory workers shared by two gateways' pools: the worker
refuses past its bound and the refused request waits for room instead of failing; a gateway
that heard the worker's count routes around it; the bound is the worker's unless this gateway's
own flag is lower."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from libs.gateway.fleet.admission import Admission, AdmissionConfig
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from tests.libs.gateway.fake_workers import FakeDetokenizer, FakeWorker, fake_pool, simple_spec, text, until

pytestmark = pytest.mark.anyio
ANSWER = "<3><4>"


def gateway(pool: WorkerPool, **config: Any) -> tuple[Serving, Admission]:
    admission = Admission(pool, AdmissionConfig(**config))
    policy = create_policy("round_robin")
    return Serving(pool, FakeDetokenizer(), policy, policy, admission=admission), admission  # type: ignore[arg-type]


def retries(stage: str) -> float:
    return REGISTRY.get_sample_value("cleave_gateway_retries_total", {"stage": stage}) or 0.0


async def test_two_gateways_never_run_more_than_the_workers_bound_and_lose_nothing() -> None:
    worker = FakeWorker(max_inflight=2)
    worker.hold = asyncio.Event()
    first_pool, second_pool = await fake_pool({"both": [worker]}), await fake_pool({"both": [worker]})
    (first, _), (second, second_admission) = gateway(first_pool), gateway(second_pool)
    assert second_admission.limit(second_pool.endpoints[0]) == 2  # the worker's, not 2 x max_num_seqs
    before = retries("at_capacity")
    running = [asyncio.create_task(text(first, simple_spec(f"a{i}"))) for i in range(2)]
    await until(lambda: worker.generating == 2)
    # The second gateway has not heard the worker's count: the worker refuses its first
    # request, which waits in its queue for room; the next waits there without being sent.
    refused = [asyncio.create_task(text(second, simple_spec(f"b{i}"))) for i in range(2)]
    await until(lambda: second_admission.queued == 2)
    assert worker.refused == 1 and retries("at_capacity") == before + 1
    assert second_pool.endpoints[0].full and not any(task.done() for task in refused)
    worker.hold.set()
    assert await asyncio.gather(*running) == [ANSWER] * 2
    await second_pool.poll_once()  # the worker's next report: room
    assert await asyncio.gather(*refused) == [ANSWER] * 2
    assert worker.peak == 2
    assert [p.endpoints[0].admitted for p in (first_pool, second_pool)] == [0, 0]


async def test_a_gateway_that_heard_the_workers_count_routes_around_it_unrefused() -> None:
    busy, free = FakeWorker(max_inflight=2), FakeWorker(max_inflight=2)
    busy.hold = asyncio.Event()
    busy.elsewhere = 2  # another gateway's requests fill it
    pool = await fake_pool({"both": [busy, free]})
    serving, admission = gateway(pool)
    assert [e.elsewhere for e in pool.endpoints] == [2, 0]
    answers = await asyncio.gather(*(text(serving, simple_spec(f"r{i}")) for i in range(4)))
    assert answers == [ANSWER] * 4
    assert busy.calls["Generate"] == 0 and busy.refused == 0 and free.calls["Generate"] == 4
    busy.elsewhere = 0
    await pool.poll_once()
    assert pool.endpoints[0].elsewhere == 0 and admission.queued == 0


async def test_a_prefill_worker_at_its_bound_makes_the_request_wait_not_fail() -> None:
    prefill, decode = FakeWorker(max_inflight=1), FakeWorker()
    prefill.elsewhere = 1
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    pool.endpoints[0].elsewhere = 0  # the report raced the other gateway: it looks free here
    serving, admission = gateway(pool)
    request = asyncio.create_task(text(serving, simple_spec("r")))
    await until(lambda: admission.queued == 1)
    assert prefill.refused == 1 and prefill.calls["Prefill"] == 1
    prefill.elsewhere = 0
    await pool.poll_once()
    assert await request == ANSWER
    assert prefill.calls["Prefill"] == 2 and decode.calls["Generate"] == 1
    assert [e.admitted for e in pool.endpoints] == [0, 0]


async def test_this_gateways_own_bound_applies_when_lower_than_the_workers() -> None:
    pool = await fake_pool({"both": [FakeWorker(max_inflight=6)]})
    assert Admission(pool, AdmissionConfig(max_inflight_per_worker=4)).limit(pool.endpoints[0]) == 4
    assert Admission(pool, AdmissionConfig(max_inflight_per_worker=10)).limit(pool.endpoints[0]) == 6
    assert Admission(pool).limit(pool.endpoints[0]) == 6
