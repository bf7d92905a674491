"""The one wrapper of servicer methods, over a real loopback server: what a method raises ends
the call with the status libs.rpc.errors maps it to (library errors first translated by
`refusals`), calls are counted by method and outcome, successful ones timed; a stream delivers
what it yielded before its status, and a call the client cancels closes the method's stream
at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.errors import InvalidRequest, Unavailable
from libs.rpc.methods import rpc_method, rpc_stream
from libs.rpc.metrics import RpcMetrics
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding

pytestmark = pytest.mark.anyio

SERVICE = "test"


class LibraryError(ValueError):
    """A library's own word for the caller's mistake (as the kvstore's InvalidKey)."""


REGISTRY = CollectorRegistry()
METRICS = RpcMetrics(
    Counter("test_requests_total", "calls", ["method", "outcome"], registry=REGISTRY),
    Histogram("test_rpc_seconds", "time", ["method"], registry=REGISTRY),
)


class Servicer(worker_pb2_grpc.WorkerServicer):
    """GetInfo answers or raises `error`; Generate streams two chunks, then raises `error`
    (if set), or waits forever once `hang` is set."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.hang = False
        self.closed = asyncio.Event()

    @rpc_method(service=SERVICE, metrics=METRICS, refusals={LibraryError: InvalidRequest})
    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        if self.error is not None:
            raise self.error
        return worker_pb2.WorkerInfo(model="m")

    @rpc_stream(service=SERVICE, metrics=METRICS)
    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        try:
            for token in (1, 2):
                yield worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(token_ids=[token]))
            if self.hang:
                await asyncio.Event().wait()
            if self.error is not None:
                raise self.error
        finally:
            self.closed.set()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Servicer, worker_pb2_grpc.WorkerStub]]:
    servicer = Servicer()
    binding = ServiceBinding(
        "cleave.worker.v1.Worker", servicer, worker_pb2_grpc.add_WorkerServicer_to_server
    )
    server = GrpcServer(ServerConfig(shutdown_grace_s=0.5), [binding])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            yield servicer, worker_pb2_grpc.WorkerStub(channel)
    finally:
        await server.stop()


def counted(method: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("test_requests_total", {"method": method, "outcome": outcome}) or 0.0


def timed(method: str) -> float:
    return REGISTRY.get_sample_value("test_rpc_seconds_count", {"method": method}) or 0.0


async def test_a_unary_answer_is_counted_ok_and_timed(
    served: tuple[Servicer, worker_pb2_grpc.WorkerStub],
) -> None:
    _, stub = served
    ok, times = counted("GetInfo", "ok"), timed("GetInfo")
    assert (await stub.GetInfo(worker_pb2.GetInfoRequest())).model == "m"
    assert (counted("GetInfo", "ok"), timed("GetInfo")) == (ok + 1, times + 1)


@pytest.mark.parametrize(
    ("error", "status", "message", "outcome"),
    [
        (InvalidRequest("bad field"), grpc.StatusCode.INVALID_ARGUMENT, "bad field", "invalid_argument"),
        (LibraryError("not a key"), grpc.StatusCode.INVALID_ARGUMENT, "not a key", "invalid_argument"),
        (Unavailable("engine dead"), grpc.StatusCode.UNAVAILABLE, "engine dead", "unavailable"),
        (
            RuntimeError("secret path"),
            grpc.StatusCode.INTERNAL,
            "internal error in the test service",
            "internal",
        ),
    ],
)
async def test_a_unary_failure_ends_the_call_with_its_status_and_is_counted_not_timed(
    served: tuple[Servicer, worker_pb2_grpc.WorkerStub],
    error: Exception,
    status: grpc.StatusCode,
    message: str,
    outcome: str,
) -> None:
    servicer, stub = served
    servicer.error = error
    failures, times = counted("GetInfo", outcome), timed("GetInfo")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetInfo(worker_pb2.GetInfoRequest())
    assert (raised.value.code(), raised.value.details()) == (status, message)
    assert (counted("GetInfo", outcome), timed("GetInfo")) == (failures + 1, times)


async def test_a_stream_that_ends_is_counted_ok(served: tuple[Servicer, worker_pb2_grpc.WorkerStub]) -> None:
    _, stub = served
    ok = counted("Generate", "ok")
    responses = [r async for r in stub.Generate(worker_pb2.GenerateRequest())]
    assert [list(r.chunk.token_ids) for r in responses] == [[1], [2]]
    assert counted("Generate", "ok") == ok + 1


async def test_a_stream_that_raises_delivers_what_it_yielded_then_its_status(
    served: tuple[Servicer, worker_pb2_grpc.WorkerStub],
) -> None:
    servicer, stub = served
    servicer.error = InvalidRequest("bad stop")
    failures = counted("Generate", "invalid_argument")
    call = stub.Generate(worker_pb2.GenerateRequest())
    received = [await call.read() for _ in range(2)]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert [list(r.chunk.token_ids) for r in received] == [[1], [2]]
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad stop")
    assert counted("Generate", "invalid_argument") == failures + 1


async def test_a_cancelled_stream_closes_the_methods_generator(
    served: tuple[Servicer, worker_pb2_grpc.WorkerStub],
) -> None:
    servicer, stub = served
    servicer.hang = True
    call = stub.Generate(worker_pb2.GenerateRequest())
    await call.read()
    call.cancel()
    await asyncio.wait_for(servicer.closed.wait(), timeout=5)
