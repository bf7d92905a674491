"""One deadline per request, with in-memory workers: every hop gets the time left as its gRPC
timeout, a request past it is a 504 that blames no worker, and the deadline bound when the
request arrived (the ASGI middleware) is the one used."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2
from libs.config.roles import Role
from libs.gateway.api.http.request_deadline import RequestDeadline
from libs.gateway.common import deadline, errors
from libs.gateway.common.deadline import Deadline, DeadlineStub
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.admission import Admission, AdmissionConfig
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from tests.libs.gateway.fake_workers import FakeDetokenizer, FakeWorker, fake_pool

pytestmark = pytest.mark.anyio


def spec() -> GenerationSpec:
    return GenerationSpec("r", "m", [1, 2, 3], common_pb2.SamplingParams(max_tokens=8), [])


def pipeline(pool: WorkerPool, detokenizer: FakeDetokenizer | None = None, **options: Any) -> Serving:
    policy = create_policy("round_robin")
    return Serving(pool, detokenizer or FakeDetokenizer(), policy, policy, **options)  # type: ignore[arg-type]


async def text(p: Serving, request: GenerationSpec) -> str:
    return "".join([e.text async for e in p.generate(request) if isinstance(e, SequenceEvent)])


async def test_every_hop_gets_the_time_left_as_its_deadline() -> None:
    prefill, decode, detokenizer = FakeWorker(), FakeWorker(), FakeDetokenizer()
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    p = pipeline(pool, detokenizer, request_timeout_s=30)
    assert await text(p, spec()) == "<3><4>"
    (prefill_s,) = prefill.timeouts["Prefill"]
    (generate_s,) = decode.timeouts["Generate"]
    (detokenize_s,) = detokenizer.timeouts
    assert prefill_s is not None and 0 < prefill_s <= 30
    # Later hops get what is left, not a fresh budget.
    assert generate_s is not None and 0 < generate_s <= prefill_s
    assert detokenize_s is not None and 0 < detokenize_s <= prefill_s


async def test_no_request_timeout_means_no_deadline() -> None:
    prefill, decode, detokenizer = FakeWorker(), FakeWorker(), FakeDetokenizer()
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    await text(pipeline(pool, detokenizer, request_timeout_s=0), spec())
    assert prefill.timeouts["Prefill"] == decode.timeouts["Generate"] == detokenizer.timeouts == [None]


async def test_the_deadline_bound_when_the_request_arrived_is_used() -> None:
    decode = FakeWorker()
    pool = await fake_pool({"both": [decode]})
    p = pipeline(pool, request_timeout_s=600)
    seen: list[Deadline | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(deadline.current())
        await text(p, spec())

    await RequestDeadline(app, timeout_s=5)({"type": "http"}, None, None)  # type: ignore[arg-type]
    (generate_s,) = decode.timeouts["Generate"]
    assert seen[0] is not None and seen[0].budget_s == 5
    assert generate_s is not None and generate_s <= 5
    assert deadline.current() is None  # nothing leaks out of the request


async def test_a_request_past_its_deadline_is_504_and_blames_no_worker() -> None:
    decode = FakeWorker()
    decode.hold = asyncio.Event()  # never set: the engine is slower than the deadline
    pool = await fake_pool({"prefill": [FakeWorker()], "decode": [decode]})
    p = pipeline(pool, request_timeout_s=0.2)
    with pytest.raises(errors.ApiError) as raised:
        await text(p, spec())
    assert (raised.value.status, raised.value.type, raised.value.code) == (504, "timeout", "request_timeout")
    assert "0.2 s" in raised.value.message
    assert decode.generating == 0  # the call ended (a real worker aborts the request)
    assert [len(pool.healthy(role)) for role in (Role.PREFILL, Role.DECODE)] == [1, 1]


async def test_the_deadline_bounds_the_wait_in_the_queue() -> None:
    worker = FakeWorker()
    worker.hold = asyncio.Event()
    pool = await fake_pool({"both": [worker]})
    admission = Admission(pool, AdmissionConfig(max_inflight_per_worker=1, queue_timeout_s=60))
    p = pipeline(pool, request_timeout_s=0, admission=admission)
    running = asyncio.create_task(text(p, spec()))
    await worker.started.wait()
    with pytest.raises(errors.ApiError) as raised:
        await text(p, replace(spec(), deadline=Deadline.after(0.05)))
    assert raised.value.status == 504 and admission.queued == 0
    worker.hold.set()
    await running


class UnaryStub:
    """A tokenizer stub's unary call that records the options it was given."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []

    async def Tokenize(self, request: Any, **options: Any) -> tokenizer_pb2.TokenizeResponse:
        self.options.append(options)
        return tokenizer_pb2.TokenizeResponse(token_ids=[1])


async def test_the_tokenizer_stub_gives_each_call_the_time_left() -> None:
    inner = UnaryStub()
    stub = DeadlineStub(inner)
    await stub.Tokenize(tokenizer_pb2.TokenizeRequest())  # no request deadline bound
    await stub.Tokenize(tokenizer_pb2.TokenizeRequest(), timeout=1.0)
    seen: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await stub.Tokenize(tokenizer_pb2.TokenizeRequest())
        await stub.Tokenize(tokenizer_pb2.TokenizeRequest(), timeout=1.0)
        seen.extend(o["timeout"] for o in inner.options[2:])

    await RequestDeadline(app, timeout_s=30)({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert inner.options[:2] == [{}, {"timeout": 1.0}]
    assert 0 < seen[0] <= 30 and seen[1] == 1.0


async def test_a_tokenizer_call_after_the_deadline_gets_no_time() -> None:
    inner = UnaryStub()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await DeadlineStub(inner).Tokenize(tokenizer_pb2.TokenizeRequest())

    # A negative timeout: the request's time is already up when it arrives.
    await RequestDeadline(app, timeout_s=-1)({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert inner.options == [{"timeout": 0.001}]


def test_grpc_timeouts_never_reach_zero() -> None:
    expired = Deadline(time.monotonic() - 1, 1.0)
    assert expired.grpc_timeout() == 0.001
    with pytest.raises(errors.ApiError):
        expired.timeout()
    assert Deadline.after(0).timeout(3.0) == 3.0
