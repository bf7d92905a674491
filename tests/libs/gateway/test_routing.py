from __future__ import annotations

from typing import Any

import pytest

from cleave.worker.v1 import worker_pb2
from libs.gateway.pool import Endpoint
from libs.gateway.routing import POLICIES, create_policy


def endpoint(address: str, **stats: Any) -> Endpoint:
    # Policies only read addresses and stats; no channel is needed.
    unused: Any = None
    return Endpoint(
        address, "prefill", channel=unused, stub=unused, healthy=True, stats=worker_pb2.WorkerStats(**stats)
    )


def test_registry_knows_the_policies() -> None:
    assert {"round_robin", "least_load"} <= set(POLICIES)
    with pytest.raises(ValueError, match="unknown routing policy 'random'; known: least_load, round_robin"):
        create_policy("random")


def test_round_robin_cycles_in_address_order() -> None:
    policy = create_policy("round_robin")
    candidates = [endpoint("b:1"), endpoint("a:1"), endpoint("c:1")]
    assert [policy.pick(candidates, []).address for _ in range(4)] == ["a:1", "b:1", "c:1", "a:1"]


def test_least_load_prefers_fewer_in_flight_then_queue_then_kv() -> None:
    policy = create_policy("least_load")
    busy, idle = endpoint("a:1", num_running=3), endpoint("b:1", num_running=1)
    assert policy.pick([busy, idle], []).address == "b:1"
    idle.in_flight = 5
    assert policy.pick([busy, idle], []).address == "a:1"
    full, empty = endpoint("c:1", kv_cache_usage=0.9), endpoint("d:1", kv_cache_usage=0.1)
    assert policy.pick([full, empty], []).address == "d:1"


@pytest.mark.anyio
async def test_slow_polls_eject_only_after_several_but_refusals_at_once() -> None:
    import grpc

    from libs.gateway.pool import WorkerPool

    class Stub:
        def __init__(self, code: grpc.StatusCode) -> None:
            self.code = code

        async def GetStats(self, request: object, **_options: object) -> object:
            raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata())

    pool = WorkerPool({}, slow_polls_to_eject=3)
    slow, gone = endpoint("a:1"), endpoint("b:1")
    slow.stub, gone.stub = Stub(grpc.StatusCode.DEADLINE_EXCEEDED), Stub(grpc.StatusCode.UNAVAILABLE)  # type: ignore[assignment]
    pool.endpoints = [slow, gone]
    await pool.poll_once()
    assert slow.healthy and not gone.healthy
    await pool.poll_once()
    await pool.poll_once()
    assert not slow.healthy
