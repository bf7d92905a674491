"""In-memory stand-ins for the worker and tokenizer stubs the pipeline calls, so routing,
admission, breakers and deadlines are tested without a network. Each records the timeout of
every call it gets (a gRPC deadline is the time left, so what a fake sees is what a real
server would be given)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.serving.generate import Serving
from libs.rpc import at_capacity

TOKENS = [3, 4]


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Stream:
    """A unary-stream call: async iteration and cancel(), as grpc.aio's."""

    def __init__(self, responses: AsyncIterator[worker_pb2.GenerateResponse]) -> None:
        self._responses = responses
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        return self._responses

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeWorker:
    """The WorkerStub calls the gateway makes. Generate answers TOKENS; `fail` makes every
    request call fail with that status; `hold` keeps each Generate open until it is set, and
    `generating` counts the Generates open; `max_num_seqs` is what GetInfo reports.
    `max_inflight` (0: none) is its own bound on running requests, counting `elsewhere` (other
    gateways' requests): one more is refused at capacity, as libs/worker/capacity.py does."""

    def __init__(self, *, max_num_seqs: int = 8, max_inflight: int = 0) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_inflight = max_inflight
        self.elsewhere = 0
        self.prefilling = 0
        self.peak = 0  # the most requests it ran at once, `elsewhere` included
        self.refused = 0
        self.fail: grpc.StatusCode | None = None
        self.poll_fail: grpc.StatusCode | None = None
        self.hold: asyncio.Event | None = None
        self.generating = 0
        self.started = asyncio.Event()  # set when a Generate starts
        self.timeouts: dict[str, list[float | None]] = defaultdict(list)
        self.calls: dict[str, int] = defaultdict(int)

    def _record(self, method: str, timeout: float | None) -> None:
        self.calls[method] += 1
        self.timeouts[method].append(timeout)

    @property
    def inflight(self) -> int:
        return self.generating + self.prefilling + self.elsewhere

    def _admit(self) -> None:
        if self.max_inflight and self.inflight >= self.max_inflight:
            self.refused += 1
            raise rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, at_capacity.message("full"))

    def _counted(self) -> None:
        self.peak = max(self.peak, self.inflight)

    async def Prefill(self, request: worker_pb2.PrefillRequest, **options: Any) -> worker_pb2.PrefillResponse:
        self._record("Prefill", options.get("timeout"))
        if self.fail is not None:
            raise rpc_error(self.fail, "prefill failed")
        self._admit()
        self.prefilling += 1
        self._counted()
        try:
            await asyncio.sleep(0)
        finally:
            self.prefilling -= 1
        handoff = worker_pb2.KvHandoff(transport="nixl", num_tokens=len(request.prompt_token_ids))
        return worker_pb2.PrefillResponse(first_token_id=TOKENS[0], handoff=handoff)

    def Generate(self, request: worker_pb2.GenerateRequest, *, timeout: float | None = None) -> _Stream:
        self._record("Generate", timeout)
        return _Stream(self._generate(request, timeout))

    async def _generate(
        self, request: worker_pb2.GenerateRequest, deadline_s: float | None
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self._admit()
        self.generating += 1
        counted = True
        self._counted()
        self.started.set()
        try:
            if self.fail is not None:
                raise rpc_error(self.fail, "generate failed")
            if self.hold is not None:
                try:
                    # What gRPC does with the call's deadline while the worker holds it.
                    await asyncio.wait_for(self.hold.wait(), deadline_s)
                except TimeoutError:
                    raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            chunk = worker_pb2.TokenChunk(token_ids=TOKENS, finish_reason=common_pb2.FINISH_REASON_LENGTH)
            yield worker_pb2.GenerateResponse(chunk=chunk)
            usage = common_pb2.Usage(
                prompt_tokens=len(request.prompt_token_ids), completion_tokens=len(TOKENS)
            )
            # As the worker does: out of its count before the last response leaves.
            counted, self.generating = False, self.generating - 1
            yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))
        finally:
            if counted:
                self.generating -= 1

    async def ReleaseKv(self, request: Any, **options: Any) -> worker_pb2.ReleaseKvResponse:
        self._record("ReleaseKv", options.get("timeout"))
        return worker_pb2.ReleaseKvResponse()

    async def GetStats(self, request: Any, **options: Any) -> worker_pb2.WorkerStats:
        self._record("GetStats", options.get("timeout"))
        if self.poll_fail is not None:
            raise rpc_error(self.poll_fail, "poll failed")
        return worker_pb2.WorkerStats(num_inflight=self.inflight)

    async def GetInfo(self, request: Any, **_options: Any) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(
            vocab_size=100,
            max_model_len=2048,
            max_num_seqs=self.max_num_seqs,
            max_inflight_requests=self.max_inflight,
        )


class _DetokenizeCall:
    """A stream-stream call: read() answers each request message in turn."""

    def __init__(self, requests: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest]) -> None:
        self._requests = requests

    async def read(self) -> tokenizer_pb2.DetokenizeStreamResponse | object:
        async for message in self._requests:
            kind = message.WhichOneof("kind")
            if kind == "tokens":
                text = "".join(f"<{t}>" for t in message.tokens.token_ids)
                return tokenizer_pb2.DetokenizeStreamResponse(delta=tokenizer_pb2.TextDelta(text=text))
            if kind == "finish":
                return tokenizer_pb2.DetokenizeStreamResponse(complete=tokenizer_pb2.DetokenizeComplete())
        return grpc.aio.EOF

    def cancel(self) -> bool:
        return True


class FakeDetokenizer:
    """The tokenizer stub's DetokenizeStream: id N becomes "<N>"; records each call's timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def DetokenizeStream(self, requests: Any, *, timeout: float | None = None) -> _DetokenizeCall:
        self.timeouts.append(timeout)
        return _DetokenizeCall(aiter(requests))


async def fake_pool(roles: Mapping[str, Sequence[Any]], **options: Any) -> WorkerPool:
    """A pool of in-memory workers at addresses "<role>-<i>", polled once (all answer)."""
    pool = WorkerPool({}, **options)
    for role, workers in roles.items():
        for i, worker in enumerate(workers):
            pool.add(f"{role}-{i}", Role(role), worker)
    await pool.poll_once()
    return pool


def simple_spec(request_id: str = "r") -> GenerationSpec:
    """A 3-token prompt, up to 8 tokens: what the fake workers answer TOKENS to."""
    return GenerationSpec(request_id, "m", [1, 2, 3], common_pb2.SamplingParams(max_tokens=8), [])


async def text(serving: Serving, request: GenerationSpec) -> str:
    """A request's whole text through `serving`."""
    return "".join([e.text async for e in serving.generate(request) if isinstance(e, SequenceEvent)])


async def until(condition: Callable[[], bool]) -> None:
    """Polls a condition the event loop makes true (bounded, so a bug fails instead of hanging)."""
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")
