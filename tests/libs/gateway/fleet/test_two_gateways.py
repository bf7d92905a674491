"""Two gateways' pools and admission over the real worker servicer (fake engine) on loopback:
the worker's own bound holds for both together, its count reaches each gateway on the shared
GenerateMany call's messages, and every request of both is served."""

from __future__ import annotations

import asyncio

import pytest

from cleave.common.v1 import common_pb2
from libs.config.roles import Role
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.admission import Admission
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from libs.rpc.server import GrpcServer, ServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.service import WorkerService
from services.worker.servicer import WorkerServicer, binding
from tests.libs.gateway.fake_workers import FakeDetokenizer
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio
BOUND = 3


async def gateway(address: str) -> tuple[Serving, WorkerPool]:
    pool = WorkerPool({Role.BOTH: [address]})
    await pool.poll_once()
    policy = create_policy("round_robin")
    serving = Serving(pool, FakeDetokenizer(), policy, policy, admission=Admission(pool))  # type: ignore[arg-type]
    return serving, pool


async def tokens(serving: Serving, request_id: str) -> int:
    spec = GenerationSpec(
        request_id, "fake", [5, 6], common_pb2.SamplingParams(max_tokens=10, temperature=0), []
    )
    return sum([1 async for e in serving.generate(spec) if isinstance(e, SequenceEvent) and e.text])


async def test_two_gateways_together_never_run_more_than_the_workers_bound() -> None:
    config = WorkerConfig(
        role=Role.BOTH, model="/nonexistent", served_model_name="fake", max_inflight_requests=BOUND
    )
    service = WorkerService(config, FakeEngine(token_delay_s=0.01))
    server = GrpcServer(ServerConfig(port=0, shutdown_grace_s=0), [binding(WorkerServicer(service))])
    await server.start()
    (first, first_pool), (second, second_pool) = await gateway(server.address), await gateway(server.address)
    peak = heard_elsewhere = 0

    async def watch(stop: asyncio.Event) -> None:
        nonlocal peak, heard_elsewhere
        while not stop.is_set():
            peak = max(peak, service.num_inflight)
            heard = max(p.endpoints[0].elsewhere for p in (first_pool, second_pool))
            heard_elsewhere = max(heard_elsewhere, heard)
            await asyncio.sleep(0.001)

    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(stop))
    try:
        assert first_pool.endpoints[0].info is not None
        assert first_pool.endpoints[0].info.max_inflight_requests == BOUND
        requests = [tokens(first, f"a{i}") for i in range(8)] + [tokens(second, f"b{i}") for i in range(8)]
        counts = await asyncio.wait_for(asyncio.gather(*requests), 30)
        assert counts == [10] * 16  # every token of every request: none failed or was cut
        assert 0 < peak <= BOUND
        # The worker's count came back on the shared call's messages (no poll ran meanwhile),
        # the other gateway's requests in it.
        assert heard_elsewhere > 0
        assert service.num_inflight == 0
        assert [p.endpoints[0].admitted for p in (first_pool, second_pool)] == [0, 0]
    finally:
        stop.set()
        await watcher
        await first_pool.close()
        await second_pool.close()
        await server.stop()
