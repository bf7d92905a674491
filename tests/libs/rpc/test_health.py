"""Cleave's health servicer (libs/rpc/health.py) over loopback: watchers hear every change,
one watcher leaving does not silence the others, and a shutdown ends their streams."""

from __future__ import annotations

import asyncio

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.rpc.channel import open_channel
from libs.rpc.health import NOT_SERVING, SERVING, HealthServicer

pytestmark = pytest.mark.anyio


async def serve(health: HealthServicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_watchers_hear_changes_and_one_leaving_does_not_silence_the_others() -> None:
    health = HealthServicer()
    server, address = await serve(health)
    try:
        async with open_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            first = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            second = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await first.read()).status == SERVING
            assert (await second.read()).status == SERVING
            first.cancel()  # grpc_health's servicer forgot the service's watchers here
            await asyncio.sleep(0.1)
            await health.set("", NOT_SERVING)
            async with asyncio.timeout(2):
                assert (await second.read()).status == NOT_SERVING
            await health.set("", SERVING)
            async with asyncio.timeout(2):
                assert (await second.read()).status == SERVING
            second.cancel()
    finally:
        await server.stop(0)


async def test_a_shutdown_tells_watchers_then_ends_their_streams() -> None:
    health = HealthServicer()
    server, address = await serve(health)
    try:
        async with open_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            await health.enter_graceful_shutdown()
            await health.set("", SERVING)  # ignored from now on
            async with asyncio.timeout(2):
                assert (await watch.read()).status == NOT_SERVING
                assert await watch.read() is grpc.aio.EOF  # the stream ended: nothing holds the stop
            check = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == NOT_SERVING
    finally:
        await server.stop(0)
