"""The gateway's shared GenerateMany call against the real worker servicer (fake engine) on
loopback: each request behaves as its own Generate call would, failures included, because
the pipeline's fault attribution reads the same statuses from either."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.shared_stream import GenerateCall
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.service import WorkerService
from services.worker.servicer import WorkerServicer, binding
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


def worker(engine: FakeEngine, port: int = 0) -> tuple[GrpcServer, WorkerService]:
    config = WorkerConfig(role=Role.BOTH, model="/nonexistent", served_model_name="fake")
    service = WorkerService(config, engine)
    server = GrpcServer(ServerConfig(port=port, shutdown_grace_s=0), [binding(WorkerServicer(service))])
    return server, service


async def serve(engine: FakeEngine) -> tuple[GrpcServer, Endpoint]:
    server, service = worker(engine)
    await server.start()
    channel = open_channel(server.address)
    stub = worker_pb2_grpc.WorkerStub(channel)
    endpoint = Endpoint(server.address, Role.BOTH, channel, stub, healthy=True, info=service.info())
    return server, endpoint


async def stop(server: GrpcServer, endpoint: Endpoint) -> None:
    """The client's channel closed before the loop ends (gRPC's completion queue would post its
    last events to a closed loop otherwise), then the server."""
    if endpoint.channel is not None:
        await endpoint.channel.close()
    await server.stop()


def request(request_id: str, max_tokens: int = 4, **sampling: object) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id=request_id),
        prompt_token_ids=[5, 6],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, **sampling),  # type: ignore[arg-type]
    )


async def drain(call: GenerateCall) -> list[worker_pb2.GenerateResponse]:
    return [response async for response in call]


def tokens(responses: list[worker_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]


async def test_requests_on_the_shared_call_stream_what_their_own_calls_do() -> None:
    server, endpoint = await serve(FakeEngine(token_delay_s=0.01))
    try:
        assert endpoint.info is not None and endpoint.info.generate_many
        shared = await asyncio.gather(*(drain(endpoint.generate(request(f"s{i}"), 10)) for i in range(6)))
        own = await asyncio.gather(
            *(drain(endpoint.stub.Generate(request(f"o{i}"), timeout=10)) for i in range(6))
        )
        assert endpoint.shared_stream is not None  # the requests did go over GenerateMany
    finally:
        await stop(server, endpoint)
    assert shared == own
    assert [r.WhichOneof("kind") for r in shared[0]] == ["chunk"] * 4 + ["complete"]
    assert tokens(shared[0]) == [7, 8, 9, 10]


async def test_a_refused_request_raises_its_own_status_and_the_others_go_on() -> None:
    server, endpoint = await serve(FakeEngine(token_delay_s=0.01))
    try:
        good = asyncio.create_task(drain(endpoint.generate(request("good"), 10)))
        with pytest.raises(grpc.aio.AioRpcError) as shared:
            await drain(endpoint.generate(request("bad", stop_token_ids=[70000]), 10))
        with pytest.raises(grpc.aio.AioRpcError) as own:
            await drain(endpoint.stub.Generate(request("bad2", stop_token_ids=[70000]), timeout=10))
        assert tokens(await good) == [7, 8, 9, 10]
    finally:
        await stop(server, endpoint)
    assert shared.value.code() == own.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert shared.value.details() == own.value.details()


async def test_cancel_aborts_the_request_in_the_engine() -> None:
    engine = FakeEngine(token_delay_s=0.05)
    server, endpoint = await serve(engine)
    try:
        call = endpoint.generate(request("gone", max_tokens=50), 10)
        stream = call.__aiter__()
        await anext(stream)
        assert call.cancel()
        other = await drain(endpoint.generate(request("next", max_tokens=2), 10))
        for _ in range(100):
            if "gone" in engine.aborted:
                break
            await asyncio.sleep(0.02)
    finally:
        await stop(server, endpoint)
    assert "gone" in engine.aborted
    assert tokens(other) == [7, 8]
    assert not call.cancel()  # already ended


async def test_the_deadline_ends_a_request_as_grpc_would_and_frees_it() -> None:
    engine = FakeEngine(token_delay_s=0.2)
    server, endpoint = await serve(engine)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await drain(endpoint.generate(request("slow", max_tokens=50), 0.3))
        for _ in range(100):
            if "slow" in engine.aborted:
                break
            await asyncio.sleep(0.02)
    finally:
        await stop(server, endpoint)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "slow" in engine.aborted


async def test_the_worker_going_away_fails_every_request_on_the_call_and_a_new_call_follows() -> None:
    server, endpoint = await serve(FakeEngine(token_delay_s=0.05))
    calls = [endpoint.generate(request(f"r{i}", max_tokens=50), 10) for i in range(3)]
    streams = [call.__aiter__() for call in calls]
    for stream in streams:
        await anext(stream)
    await server.stop()
    codes = []
    for stream in streams:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in stream:
                pass
        codes.append(raised.value.code())
    assert codes == [codes[0]] * 3 and codes[0] is not grpc.StatusCode.OK
    # A worker at the same address again: the next request opens a new call and is served.
    port = int(endpoint.address.rsplit(":", 1)[1])
    again, _ = worker(FakeEngine(), port)
    await again.start()
    try:
        served: list[worker_pb2.GenerateResponse] = []
        refusals: list[grpc.StatusCode] = []
        for _ in range(50):
            try:
                served = await drain(endpoint.generate(request("after", max_tokens=2), 10))
                break
            except grpc.aio.AioRpcError as error:  # the channel may still be reconnecting
                refusals.append(error.code())
                await asyncio.sleep(0.1)
        assert tokens(served) == [7, 8]
        assert set(refusals) <= {grpc.StatusCode.UNAVAILABLE}
    finally:
        await stop(again, endpoint)


class RecordingConnection:
    """A connection that records what the call asks of it."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.forgotten: list[str] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)


async def tokens_until_error(call: object) -> tuple[list[int], grpc.aio.AioRpcError]:
    received: list[int] = []
    try:
        async for response in call:  # type: ignore[attr-defined]
            received.extend(response.chunk.token_ids)
    except grpc.aio.AioRpcError as error:
        return received, error
    raise AssertionError(f"the call ended without an error after {received}")


def token_item(request_id: str, token: int) -> worker_pb2.StreamItem:
    chunk = worker_pb2.TokenChunk(token_ids=[token])
    return worker_pb2.StreamItem(request_id=request_id, response=worker_pb2.GenerateResponse(chunk=chunk))


async def test_a_reader_that_falls_too_far_behind_is_stopped_and_holds_no_more() -> None:
    from libs.gateway.fleet.shared_stream import MAX_BACKLOG, SharedCall

    connection = RecordingConnection()
    call = SharedCall(connection, "slow", timeout=None)  # type: ignore[arg-type]
    for token in range(MAX_BACKLOG + 50):  # the worker goes on; nobody reads
        call.deliver(token_item("slow", token))
    assert connection.cancelled == ["slow"]  # stopped on the worker at once
    assert call._items.qsize() == MAX_BACKLOG + 1  # the backlog and the error: nothing more
    received, error = await tokens_until_error(call)
    assert received == list(range(MAX_BACKLOG))  # what was held arrives, in order, then the error
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_the_deadline_stops_the_request_even_while_responses_flow() -> None:
    from libs.gateway.fleet.shared_stream import SharedCall

    connection = RecordingConnection()
    call = SharedCall(connection, "late", timeout=0.05)  # type: ignore[arg-type]
    call.deliver(token_item("late", 1))
    await asyncio.sleep(0.1)
    tokens, error = await tokens_until_error(call)
    assert tokens == [1] and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert connection.cancelled == ["late"]
