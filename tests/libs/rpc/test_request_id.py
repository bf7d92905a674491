"""Request ids cross real loopback gRPC hops and stay separate under concurrency."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.observability.logging import bound_request_id, current_request_id
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding

pytestmark = pytest.mark.anyio


class EchoRequestId(worker_pb2_grpc.WorkerServicer):
    """Answers GetInfo with the request id bound in its handler's log context."""

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        await asyncio.sleep(0.01)  # let concurrent requests interleave
        return worker_pb2.WorkerInfo(model=current_request_id() or "")


class Forwarder(worker_pb2_grpc.WorkerServicer):
    """A middle hop: calls the next service without passing the id explicitly."""

    def __init__(self, next_address: str) -> None:
        self._next_address = next_address

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        async with open_channel(self._next_address) as channel:
            return await worker_pb2_grpc.WorkerStub(channel).GetInfo(request)


def binding(servicer: worker_pb2_grpc.WorkerServicer) -> ServiceBinding:
    return ServiceBinding("cleave.worker.v1.Worker", servicer, worker_pb2_grpc.add_WorkerServicer_to_server)


async def test_request_id_propagates_across_two_hops() -> None:
    last = GrpcServer(ServerConfig(), [binding(EchoRequestId())])
    await last.start()
    middle = GrpcServer(ServerConfig(), [binding(Forwarder(last.address))])
    await middle.start()
    try:
        async with open_channel(middle.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)

            async def call(request_id: str) -> str:
                with bound_request_id(request_id):
                    info = await stub.GetInfo(worker_pb2.GetInfoRequest())
                return info.model

            ids = [f"req-{i}" for i in range(20)]
            seen = await asyncio.gather(*(call(i) for i in ids))
        assert seen == ids
    finally:
        await middle.stop()
        await last.stop()


async def test_server_assigns_an_id_when_none_arrives() -> None:
    server = GrpcServer(ServerConfig(), [binding(EchoRequestId())])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:  # no interceptors
            stub = worker_pb2_grpc.WorkerStub(channel)
            first = await stub.GetInfo(worker_pb2.GetInfoRequest())
            second = await stub.GetInfo(worker_pb2.GetInfoRequest())
        assert len(first.model) == 32 and first.model != second.model
    finally:
        await server.stop()


async def test_explicit_metadata_wins_over_context() -> None:
    server = GrpcServer(ServerConfig(), [binding(EchoRequestId())])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            with bound_request_id("from-context"):
                info = await stub.GetInfo(
                    worker_pb2.GetInfoRequest(), metadata=(("x-request-id", "explicit"),)
                )
        assert info.model == "explicit"
    finally:
        await server.stop()


@pytest.fixture(autouse=True)
def _no_leak_between_tests() -> None:
    assert current_request_id() is None
