"""A worker stopping under load, seen from the gateway (real gRPC on loopback: real worker
services over the in-memory engine, the gateway's pool with its health watches and its serving
room). The worker's drain is libs/worker/drain.py; the gateway's side: its health watch stops
routing to it at once (libs/gateway/fleet/health_watch.py), a draining refusal goes to another
worker (libs/gateway/serving/decode.py), a hand-off is migrated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import pytest

from cleave.common.v1 import common_pb2
from libs.config.roles import Role
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.gateway.serving.generate import Serving
from libs.rpc.server import GrpcServer, ServerConfig, drain_and_stop
from libs.worker.config import WorkerConfig
from libs.worker.service import WorkerService
from services.worker.servicer import WorkerServicer, binding
from tests.libs.gateway.fake_workers import FakeDetokenizer
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", autouse=True)
async def one_event_loop(anyio_backend: str) -> AsyncIterator[None]:
    """Every test here on one event loop (anyio's runner lives while a fixture holds it).
    grpc.aio delivers a call's last events to the loop it ran on; with a loop per test, a
    previous test's late event could reach a closed loop ("Event loop is closed", seen under
    load), which a gateway, on one loop for its life, never meets."""
    yield  # noqa: PT022 (the held generator keeps anyio's runner, and its loop, alive)


PROMPT = [5, 6, 7]
STREAMS = 8


class First:
    """Routes to the first candidate: every request on worker A while A takes requests."""

    name = "first"

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: object = None,
    ) -> Endpoint:
        return candidates[0]


@dataclass
class Worker:
    service: WorkerService
    engine: FakeEngine
    server: GrpcServer


@dataclass
class Stack:
    workers: list[Worker] = field(default_factory=list)
    pool: WorkerPool | None = None

    async def start(self, *, grace_s: float, token_delay_s: float, shared_streams: bool) -> Serving:
        for _ in range(2):
            engine = FakeEngine(token_delay_s=token_delay_s)
            config = WorkerConfig(role=Role.BOTH, model="/nonexistent", served_model_name="fake")
            service = WorkerService(config, engine)
            server = GrpcServer(ServerConfig(shutdown_grace_s=grace_s), [binding(WorkerServicer(service))])
            await server.start()
            self.workers.append(Worker(service, engine, server))
        self.pool = WorkerPool(
            {Role.BOTH: [w.server.address for w in self.workers]},
            poll_interval_s=0.2,
            shared_streams=shared_streams,
        )
        await self.pool.start()
        return Serving(self.pool, FakeDetokenizer(), First(), First())  # type: ignore[arg-type]

    def endpoint(self, index: int) -> Endpoint:
        assert self.pool is not None
        return next(e for e in self.pool.endpoints if e.address == self.workers[index].server.address)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        for worker in self.workers:
            await worker.server.stop(0)


@pytest.fixture(params=["shared", "per-request"])
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Stack, bool]]:
    s = Stack()
    yield s, request.param == "shared"
    await s.close()


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    finished: Finished | None = None
    error: BaseException | None = None


async def run(serving: Serving, request_id: str, max_tokens: int, into: Run) -> Run:
    spec = GenerationSpec(
        request_id, "fake", PROMPT, common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0), []
    )
    try:
        async for event in serving.generate(spec):
            if isinstance(event, SequenceEvent):
                into.tokens.extend(event.token_ids)
            else:
                into.finished = event
    except Exception as error:  # the test asserts there is none
        into.error = error
    return into


def expected(max_tokens: int) -> list[int]:
    """What the in-memory engine generates for PROMPT, uninterrupted (greedy)."""
    return [PROMPT[-1] + 1 + i for i in range(max_tokens)]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (polling a test's condition)
            await asyncio.sleep(0.01)
    return loop.time() - started


async def test_a_drained_worker_finishes_its_streams_and_gets_no_new_ones(stack: tuple[Stack, bool]) -> None:
    s, shared = stack
    serving = await s.start(grace_s=10, token_delay_s=0.02, shared_streams=shared)
    a, b = s.workers
    runs = [Run() for _ in range(STREAMS)]
    tasks = [asyncio.create_task(run(serving, f"r{i}", 60, runs[i])) for i in range(STREAMS)]
    await wait_for(lambda: min(len(r.tokens) for r in runs) >= 5)
    assert len(a.engine.running) == STREAMS and not b.engine.running

    loop = asyncio.get_running_loop()
    signalled = loop.time()
    stopping = asyncio.create_task(drain_and_stop(a.server, a.service.drain))
    # The gateway hears NOT_SERVING on its health watch and routes elsewhere at once.
    heard = await wait_for(lambda: not s.endpoint(0).serving, timeout_s=1.0)
    late = await run(serving, "late", 4, Run())
    assert late.error is None and late.tokens == expected(4)
    assert b.engine.calls[-1]["request_id"] == "late"

    await asyncio.gather(*tasks)
    await stopping
    stopped_after = loop.time() - signalled
    for r in runs:
        assert r.error is None and r.tokens == expected(60), r
    assert not a.engine.aborted  # all finished there, nothing handed off
    assert heard < 0.5 and stopped_after < 5, (heard, stopped_after)


async def test_what_the_grace_leaves_is_handed_off_and_continues_elsewhere_unchanged(
    stack: tuple[Stack, bool],
) -> None:
    s, shared = stack
    serving = await s.start(grace_s=1.5, token_delay_s=0.05, shared_streams=shared)  # 60 tokens: 3 s
    a, b = s.workers
    runs = [Run() for _ in range(STREAMS)]
    tasks = [asyncio.create_task(run(serving, f"r{i}", 60, runs[i])) for i in range(STREAMS)]
    await wait_for(lambda: min(len(r.tokens) for r in runs) >= 5)
    loop = asyncio.get_running_loop()
    signalled = loop.time()
    await drain_and_stop(a.server, a.service.drain)
    stopped_after = loop.time() - signalled
    await asyncio.gather(*tasks)
    assert stopped_after <= 1.5 + 0.3, stopped_after
    assert set(a.engine.aborted) == {f"r{i}" for i in range(STREAMS)}
    for r in runs:
        # Moved to B from the tokens already streamed: the same greedy text, none lost or doubled.
        assert r.error is None and r.tokens == expected(60), r
    assert {c["request_id"] for c in b.engine.calls} == {f"r{i}" for i in range(STREAMS)}


async def test_a_request_sent_before_the_gateway_heard_of_the_drain_goes_elsewhere(
    stack: tuple[Stack, bool],
) -> None:
    s, shared = stack
    serving = await s.start(grace_s=10, token_delay_s=0.0, shared_streams=shared)
    a, b = s.workers
    # The worker drains but its health still says SERVING (the gateway cannot know yet).
    await a.service.drain(asyncio.get_running_loop().time() + 1)
    assert s.endpoint(0).serving
    result = await run(serving, "r", 6, Run())
    assert result.error is None and result.tokens == expected(6)
    assert not a.engine.calls and [c["request_id"] for c in b.engine.calls] == ["r"]
