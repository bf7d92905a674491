"""Standard gRPC health and reflection (when enabled) over loopback, and graceful shutdown."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.options import RpcOptions
from libs.rpc.ports import free_port
from libs.rpc.security import RpcSecurity
from libs.rpc.server import (
    REPLICA_CONNECTION_AGE_MS,
    GrpcServer,
    ServerConfig,
    ServiceBinding,
    drain_and_stop,
    drain_deadline,
)

WORKER = "cleave.worker.v1.Worker"

pytestmark = pytest.mark.anyio


class SlowWorker(worker_pb2_grpc.WorkerServicer):
    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        await asyncio.sleep(0.5)
        return worker_pb2.WorkerInfo(model="done")


def make_server(**config: object) -> GrpcServer:
    binding = ServiceBinding(WORKER, SlowWorker(), worker_pb2_grpc.add_WorkerServicer_to_server)
    return GrpcServer(ServerConfig(**config), [binding])  # type: ignore[arg-type]


async def check(address: str, service: str) -> int:
    async with open_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
        return int(response.status)


async def test_health_serving_for_server_and_service() -> None:
    server = make_server()
    await server.start()
    try:
        assert await check(server.address, "") == health_pb2.HealthCheckResponse.SERVING
        assert await check(server.address, WORKER) == health_pb2.HealthCheckResponse.SERVING
        await server.set_serving(False)
        assert await check(server.address, WORKER) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop()


async def test_unknown_service_is_not_found() -> None:
    server = make_server()
    await server.start()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await check(server.address, "cleave.nope.v1.Nope")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop()


async def test_reflection_when_enabled_lists_services() -> None:
    server = make_server(reflection=True)
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            responses = [r async for r in stub.ServerReflectionInfo(iter([request]))]
        names = {s.name for s in responses[0].list_services_response.service}
        assert {WORKER, "grpc.health.v1.Health"} <= names
    finally:
        await server.stop()


async def test_graceful_stop_drains_in_flight_calls() -> None:
    server = make_server(shutdown_grace_s=5.0)
    await server.start()
    async with open_channel(server.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest())
        await asyncio.sleep(0.1)  # the call is in flight
        stopping = asyncio.create_task(server.stop())
        info = await call
        await stopping
    assert info.model == "done"


async def test_the_health_port_serves_health_alone_in_plaintext_without_the_token() -> None:
    health_port = free_port()
    server = make_server(health_port=health_port, security=RpcSecurity(token="secret-token"))
    await server.start()
    try:
        health_address = f"127.0.0.1:{health_port}"
        assert await check(health_address, WORKER) == health_pb2.HealthCheckResponse.SERVING
        async with open_channel(health_address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest())
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # nothing else is served there
        await server.begin_drain()
        # Both ports tell the same status: a drain is seen by the probe at once.
        assert await check(health_address, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await check(server.address, "") == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop()


async def test_a_stop_says_not_serving_drains_then_stops_within_the_grace() -> None:
    server = make_server(shutdown_grace_s=2.0)
    await server.start()
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def drain(deadline: float) -> None:
        status = await check(server.address, "")
        seen.append(("status during the drain", status))
        seen.append(("deadline after", deadline - loop.time()))
        await asyncio.sleep(60)  # a drain that overruns is cut at its deadline

    started = loop.time()
    await drain_and_stop(server, drain)
    took = loop.time() - started
    assert seen[0] == ("status during the drain", health_pb2.HealthCheckResponse.NOT_SERVING)
    # The drain gets the grace less the stop's reserve (a fifth of 2 s), and the whole fits the grace.
    assert 1.4 < seen[1][1] <= 1.6
    assert 1.5 < took < 2.5, took


def test_the_drain_deadline_keeps_the_stop_its_reserve() -> None:
    assert drain_deadline(100.0, 50.0) == 145.0
    assert drain_deadline(100.0, 2.0) == 101.6
    assert drain_deadline(100.0, 0.0) == 100.0


async def test_large_messages_pass_within_limit_and_fail_beyond() -> None:
    server = make_server(rpc=RpcOptions(max_message_bytes=8 * 1024 * 1024))
    await server.start()
    try:
        async with open_channel(server.address, RpcOptions(max_message_bytes=64 * 1024 * 1024)) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            # 6 MiB exceeds gRPC's 4 MiB default but fits the configured 8 MiB.
            fits = worker_pb2.GetInfoRequest()
            fits.ParseFromString(b"\x0a" + _varint(6 * 1024 * 1024) + b"x" * (6 * 1024 * 1024))
            assert (await stub.GetInfo(fits)).model == "done"
            too_big = worker_pb2.GetInfoRequest()
            too_big.ParseFromString(b"\x0a" + _varint(9 * 1024 * 1024) + b"x" * (9 * 1024 * 1024))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetInfo(too_big)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class PeerWorker(worker_pb2_grpc.WorkerServicer):
    """GetInfo answers with the caller's address (its connection's port); GetStats is slow."""

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model=context.peer())

    async def GetStats(
        self, request: worker_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        await asyncio.sleep(1.5)
        return worker_pb2.WorkerStats(num_running=7)


async def test_an_aged_connection_is_renewed_without_cutting_a_call_or_failing_the_next() -> None:
    binding = ServiceBinding(WORKER, PeerWorker(), worker_pb2_grpc.add_WorkerServicer_to_server)
    server = GrpcServer(ServerConfig(rpc=RpcOptions(max_connection_age_ms=300)), [binding])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            first = (await stub.GetInfo(worker_pb2.GetInfoRequest(), timeout=5)).model
            slow = asyncio.ensure_future(stub.GetStats(worker_pb2.GetStatsRequest(), timeout=5))
            peers = {first}
            for _ in range(10):  # calls across the ageing all succeed
                await asyncio.sleep(0.15)
                peers.add((await stub.GetInfo(worker_pb2.GetInfoRequest(), timeout=5)).model)
            assert (await slow).num_running == 7  # outlived its connection's age: not cut
            assert len(peers) > 1  # later calls came over a new connection
    finally:
        await server.stop()


def test_replicated_services_renew_their_connections_and_workers_do_not() -> None:
    class Flags:
        host, port, port_file, shutdown_grace_s, grpc_reflection, health_port = (
            "127.0.0.1",
            0,
            None,
            1.0,
            False,
            None,
        )

    replicated = ServerConfig.of(Flags(), RpcSecurity(), replicated=True)
    worker = ServerConfig.of(Flags(), RpcSecurity())
    assert ("grpc.max_connection_age_ms", REPLICA_CONNECTION_AGE_MS) in replicated.rpc.as_grpc_options()
    assert all(name != "grpc.max_connection_age_ms" for name, _ in worker.rpc.as_grpc_options())
