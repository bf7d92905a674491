"""Admission control on the request path, with in-memory workers: the per-worker in-flight
bound, the FIFO queue, 429 with Retry-After when it is full or a wait is too long, 503 when no
worker can serve, waiters whose client left, and the breaker's half-open probe."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from libs.gateway.common import errors
from libs.gateway.fleet.admission import Admission, AdmissionConfig
from libs.gateway.fleet.breaker import BreakerConfig, BreakerState
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from tests.libs.gateway.fake_workers import FakeDetokenizer, FakeWorker, fake_pool, simple_spec, text, until

pytestmark = pytest.mark.anyio
ANSWER = "<3><4>"


def pipeline(pool: WorkerPool, **config: Any) -> tuple[Serving, Admission]:
    admission = Admission(pool, AdmissionConfig(**config))
    policy = create_policy("round_robin")
    return Serving(pool, FakeDetokenizer(), policy, policy, admission=admission), admission  # type: ignore[arg-type]


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("cleave_gateway_admission_rejected_total", {"reason": reason}) or 0.0


async def test_requests_beyond_the_bound_wait_and_go_in_arrival_order() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool, max_inflight_per_worker=1)
    finished: list[str] = []

    async def request(name: str) -> str:
        answer = await text(p, simple_spec(name))
        finished.append(name)
        return answer

    first = asyncio.create_task(request("a"))
    await until(lambda: worker.generating == 1)
    waiting = [asyncio.create_task(request(name)) for name in "bc"]
    await until(lambda: admission.queued == 2)
    assert REGISTRY.get_sample_value("cleave_gateway_queue_depth") == 2
    assert worker.calls["Generate"] == 1
    worker.hold.set()
    assert list(await asyncio.gather(first, *waiting)) == [ANSWER] * 3
    assert finished == ["a", "b", "c"]
    assert admission.queued == 0 and pool.endpoints[0].admitted == 0
    assert REGISTRY.get_sample_value("cleave_gateway_queue_depth") == 0


async def test_a_full_queue_is_429_with_retry_after() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool, max_inflight_per_worker=1, max_queued_requests=1)
    running = asyncio.create_task(text(p, simple_spec("a")))
    queued = asyncio.create_task(text(p, simple_spec("b")))
    await until(lambda: admission.queued == 1)
    before = rejected("queue_full")
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec("c"))
    assert (raised.value.status, raised.value.type, raised.value.code) == (
        429, "rate_limit_error", "rate_limit_exceeded"
    )  # fmt: skip
    assert raised.value.headers == {"Retry-After": "1"}
    assert rejected("queue_full") == before + 1
    worker.hold.set()
    assert list(await asyncio.gather(running, queued)) == [ANSWER] * 2


async def test_a_wait_past_the_queue_timeout_is_429() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool, max_inflight_per_worker=1, queue_timeout_s=0.05)
    running = asyncio.create_task(text(p, simple_spec("a")))
    await until(lambda: worker.generating == 1)
    before = rejected("queue_timeout")
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec("b"))
    assert raised.value.status == 429 and raised.value.headers["Retry-After"] == "1"
    assert rejected("queue_timeout") == before + 1 and admission.queued == 0
    worker.hold.set()
    assert await running == ANSWER


async def test_the_default_bound_is_twice_the_workers_max_num_seqs() -> None:
    worker = FakeWorker(max_num_seqs=2)
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool)
    assert admission.limit(pool.endpoints[0]) == 4
    tasks = [asyncio.create_task(text(p, simple_spec(str(i)))) for i in range(5)]
    await until(lambda: worker.generating == 4 and admission.queued == 1)
    worker.hold.set()
    assert await asyncio.gather(*tasks) == [ANSWER] * 5


async def test_a_waiter_whose_client_left_leaves_the_queue() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool, max_inflight_per_worker=1)
    running = asyncio.create_task(text(p, simple_spec("a")))
    await until(lambda: worker.generating == 1)
    gone = asyncio.create_task(text(p, simple_spec("b")))
    await until(lambda: admission.queued == 1)
    gone.cancel()  # what the HTTP layer does when the client disconnects
    await until(lambda: admission.queued == 0)
    worker.hold.set()
    assert await running == ANSWER
    assert gone.cancelled() and worker.calls["Generate"] == 1
    assert pool.endpoints[0].admitted == 0


async def test_no_routable_worker_is_503_at_once() -> None:
    pool = await fake_pool({"prefill": [FakeWorker()], "decode": [FakeWorker()]})
    p, _ = pipeline(pool)
    for _ in range(3):
        pool.request_failed(pool.endpoints[1], "UNAVAILABLE")
    assert pool.endpoints[1].breaker.state is BreakerState.OPEN
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec())
    assert (raised.value.status, raised.value.code) == (503, "no_healthy_workers")


async def test_a_worker_that_says_it_does_not_serve_is_503_at_once_not_a_wait() -> None:
    # A decode worker loading its model after a restart, or draining: its breaker may be
    # half-open, but no request should wait for it (measured: a request then hung to its timeout).
    pool = await fake_pool({"prefill": [FakeWorker()], "decode": [FakeWorker()]})
    p, admission = pipeline(pool)
    pool.endpoints[1].set_serving(False)
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec())
    assert (raised.value.status, raised.value.code) == (503, "no_healthy_workers")
    assert admission.queued == 0
    pool.endpoints[1].set_serving(True)
    assert await text(p, simple_spec("again"))


async def test_waiters_get_503_when_the_last_worker_stops_being_routed_to() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    p, admission = pipeline(pool, max_inflight_per_worker=1)
    running = asyncio.create_task(text(p, simple_spec("a")))
    await until(lambda: worker.generating == 1)
    waiting = asyncio.create_task(text(p, simple_spec("b")))
    await until(lambda: admission.queued == 1)
    for _ in range(3):
        pool.request_failed(pool.endpoints[0], "engine unavailable")
    with pytest.raises(errors.ApiError) as raised:
        await waiting
    assert raised.value.status == 503
    worker.hold.set()
    await running


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_half_open_worker_takes_one_probe_request_and_its_success_reopens_it_to_all() -> None:
    clock = Clock()
    worker = FakeWorker()
    pool = await fake_pool(
        {"both": [worker]}, breaker=BreakerConfig(failures_to_open=1, cooldown_s=5), clock=clock
    )
    p, admission = pipeline(pool)
    worker.fail = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec("fails"))
    assert raised.value.status == 503
    with pytest.raises(errors.ApiError) as raised:
        await text(p, simple_spec("refused"))  # open: not even tried
    assert raised.value.code == "no_healthy_workers" and worker.calls["Generate"] == 1

    clock.now += 5
    worker.fail, worker.hold = None, asyncio.Event()
    probe = asyncio.create_task(text(p, simple_spec("probe")))
    await until(lambda: worker.generating == 1)
    behind = asyncio.create_task(text(p, simple_spec("behind")))
    await until(lambda: admission.queued == 1)  # one probe at a time, though the bound is 16
    worker.hold.set()
    assert list(await asyncio.gather(probe, behind)) == [ANSWER] * 2
    assert pool.endpoints[0].breaker.state is BreakerState.CLOSED


async def test_client_mistakes_never_open_the_breaker() -> None:
    worker = FakeWorker()
    pool = await fake_pool({"both": [worker]}, breaker=BreakerConfig(failures_to_open=1))
    p, _ = pipeline(pool)
    worker.fail = grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(3):
        with pytest.raises(errors.ApiError) as raised:
            await text(p, simple_spec())
        assert raised.value.status == 400
    assert pool.endpoints[0].breaker.state is BreakerState.CLOSED


async def test_the_prefill_slot_is_taken_after_the_decode_slot_and_both_are_given_back() -> None:
    prefill, decode = FakeWorker(), FakeWorker()
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    p, _ = pipeline(pool, max_inflight_per_worker=1)
    assert [await text(p, simple_spec(str(i))) for i in range(3)] == [ANSWER] * 3
    assert prefill.calls["Prefill"] == 3 and decode.calls["Generate"] == 3
    assert [e.admitted for e in pool.endpoints] == [0, 0]


async def test_requests_arriving_together_spread_over_the_decode_workers_under_least_load() -> None:
    # Each holds its decode slot from before its prefill, so the next request's least-load
    # choice sees it even before any Generate has started.
    prefill, decodes = FakeWorker(), [FakeWorker(), FakeWorker()]
    for decode in decodes:
        decode.hold = asyncio.Event()
    pool = await fake_pool({"prefill": [prefill], "decode": decodes})
    policy = create_policy("least_load")
    p = Serving(pool, FakeDetokenizer(), policy, policy, admission=Admission(pool))  # type: ignore[arg-type]
    requests = [asyncio.create_task(text(p, simple_spec(f"r{i}"))) for i in range(4)]
    await until(lambda: sum(d.generating for d in decodes) == 4)
    assert [d.generating for d in decodes] == [2, 2]
    for decode in decodes:
        assert decode.hold is not None
        decode.hold.set()
    assert await asyncio.gather(*requests) == [ANSWER] * 4
