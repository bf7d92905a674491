"""GenerateMany's worker side without a network: requests run as their own streams would,
responses ready together leave together, cancels stop one request, refusals end one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.worker.generate_many import GenerateMany

pytestmark = pytest.mark.anyio


class Steps:
    """A fake engine loop: every running request gets one token per `step()`, all at once,
    as vLLM's output handler wakes every request after an engine step."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.cancelled: list[str] = []

    def step(self) -> None:
        self.event.set()
        self.event = asyncio.Event()

    async def run_one(
        self, request: worker_pb2.GenerateRequest
    ) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        if not request.prompt_token_ids:
            raise ValueError("empty prompt")
        try:
            for token in range(request.sampling.max_tokens):
                await self.event.wait()
                yield worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(token_ids=[token]))
            usage = common_pb2.Usage(completion_tokens=request.sampling.max_tokens)
            yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))
        except asyncio.CancelledError:
            self.cancelled.append(request.metadata.request_id)
            raise


def refusal(error: BaseException) -> tuple[grpc.StatusCode, str]:
    return grpc.StatusCode.INVALID_ARGUMENT, str(error)


def start(
    request_id: str, max_tokens: int = 2, prompt: tuple[int, ...] = (1,)
) -> worker_pb2.GenerateManyRequest:
    return worker_pb2.GenerateManyRequest(
        start=worker_pb2.GenerateRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id),
            prompt_token_ids=prompt,
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
    )


class Caller:
    """The gateway's end: a queue of messages to send, the responses received."""

    def __init__(self) -> None:
        self.outgoing: asyncio.Queue[worker_pb2.GenerateManyRequest | None] = asyncio.Queue()
        self.received: list[worker_pb2.GenerateManyResponse] = []

    async def requests(self) -> AsyncIterator[worker_pb2.GenerateManyRequest]:
        while (message := await self.outgoing.get()) is not None:
            yield message

    async def collect(self, responses: AsyncIterator[worker_pb2.GenerateManyResponse]) -> None:
        async for response in responses:
            self.received.append(response)

    def items(self, request_id: str) -> list[worker_pb2.StreamItem]:
        return [i for r in self.received for i in r.items if i.request_id == request_id]


def serving(steps: Steps, caller: Caller) -> asyncio.Task[None]:
    """The worker's end of one call, serving `caller`'s requests in the background."""
    return asyncio.create_task(caller.collect(GenerateMany(steps.run_one, refusal).serve(caller.requests())))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_one_engine_step_of_several_requests_leaves_as_one_message() -> None:
    steps, caller = Steps(), Caller()
    call = serving(steps, caller)
    for request_id in ("a", "b", "c"):
        caller.outgoing.put_nowait(start(request_id))
    await settle()
    steps.step()
    await settle()
    assert len(caller.received) == 1
    assert sorted(i.request_id for i in caller.received[0].items) == ["a", "b", "c"]
    steps.step()
    await settle()
    caller.outgoing.put_nowait(None)  # the caller closes its side: the call ends
    await asyncio.wait_for(call, 5)
    for request_id in ("a", "b", "c"):
        kinds = [i.response.WhichOneof("kind") for i in caller.items(request_id)]
        tokens = [t for i in caller.items(request_id) for t in i.response.chunk.token_ids]
        assert (kinds, tokens) == (["chunk", "chunk", "complete"], [0, 1])
    # Two steps, two messages; the completions came in the second step's message.
    assert len(caller.received) == 2


async def test_cancel_stops_one_request_and_the_others_go_on() -> None:
    steps, caller = Steps(), Caller()
    call = serving(steps, caller)
    caller.outgoing.put_nowait(start("keep", max_tokens=2))
    caller.outgoing.put_nowait(start("stop", max_tokens=2))
    await settle()
    steps.step()
    await settle()
    caller.outgoing.put_nowait(worker_pb2.GenerateManyRequest(cancel="stop"))
    caller.outgoing.put_nowait(worker_pb2.GenerateManyRequest(cancel="never-started"))  # ignored
    await settle()
    steps.step()
    await settle()
    caller.outgoing.put_nowait(None)
    await asyncio.wait_for(call, 5)
    assert steps.cancelled == ["stop"]
    assert [i.response.WhichOneof("kind") for i in caller.items("stop")] == ["chunk"]
    assert [i.response.WhichOneof("kind") for i in caller.items("keep")] == ["chunk", "chunk", "complete"]


async def test_a_refused_request_ends_with_its_status_alone() -> None:
    steps, caller = Steps(), Caller()
    call = serving(steps, caller)
    caller.outgoing.put_nowait(start("bad", prompt=()))
    caller.outgoing.put_nowait(start("", max_tokens=1))  # no id: nothing could name its items
    caller.outgoing.put_nowait(start("good", max_tokens=1))
    caller.outgoing.put_nowait(start("good", max_tokens=1))  # the same id while it runs
    await settle()
    steps.step()
    await settle()
    caller.outgoing.put_nowait(None)
    await asyncio.wait_for(call, 5)
    [bad] = caller.items("bad")
    assert (bad.status.code, bad.status.message) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "empty prompt",
    )
    [no_id] = caller.items("")
    assert no_id.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    good = caller.items("good")
    assert [i.WhichOneof("kind") for i in good] == ["status", "response", "response"]
    assert "already running" in good[0].status.message
    assert [i.response.WhichOneof("kind") for i in good[1:]] == ["chunk", "complete"]


async def test_the_caller_going_away_stops_every_request() -> None:
    steps, caller = Steps(), Caller()
    call = serving(steps, caller)
    caller.outgoing.put_nowait(start("a", max_tokens=5))
    caller.outgoing.put_nowait(start("b", max_tokens=5))
    await settle()
    call.cancel()  # as grpc.aio cancels the handler when the caller's call is cancelled
    with pytest.raises(asyncio.CancelledError):
        await call
    await settle()
    assert sorted(steps.cancelled) == ["a", "b"]


async def test_a_response_over_the_message_limit_ends_its_request_alone() -> None:
    async def run_one(
        request: worker_pb2.GenerateRequest,
    ) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        size = request.sampling.max_tokens  # tokens in the one chunk, ~2 bytes each
        try:
            yield worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(token_ids=[1000] * size))
            yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete())
        finally:
            closed.append(request.metadata.request_id)

    closed: list[str] = []
    caller = Caller()
    many = GenerateMany(run_one, refusal, max_message_bytes=1024 + 1000)
    call = asyncio.create_task(caller.collect(many.serve(caller.requests())))
    for request_id, tokens in (("small-1", 300), ("huge", 900), ("small-2", 300), ("small-3", 300)):
        caller.outgoing.put_nowait(start(request_id, max_tokens=tokens))
    await settle()
    caller.outgoing.put_nowait(None)
    await asyncio.wait_for(call, 5)
    [huge] = caller.items("huge")
    assert huge.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "exceeds the 1000-byte message limit" in huge.status.message
    assert "huge" in closed  # its stream was closed, so the engine aborts it
    for request_id in ("small-1", "small-2", "small-3"):
        assert [i.response.WhichOneof("kind") for i in caller.items(request_id)] == ["chunk", "complete"]
    # Three ~600-byte chunks do not fit one 1000-byte message: each message stays under it.
    assert len(caller.received) >= 3
    assert all(r.ByteSize() <= 1024 + 1000 for r in caller.received)
