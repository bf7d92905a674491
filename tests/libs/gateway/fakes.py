"""Stand-ins for the gateway's collaborators: a tokenizer with a tiny vocabulary and
pipelines that replay scripted events, so response building is tested without a network."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.gateway.api.context import ApiContext, ApiOptions
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent, check_vocabulary
from libs.gateway.fleet.facts import ModelFacts

# "é" is two UTF-8 bytes, so logprobs' "bytes" is not just the code points.
VOCAB = {1: "Hello", 2: ",", 3: " world", 4: "!", 5: "é", 6: " there"}


class FakeTokenizer:
    """The TokenizerStub calls the gateway makes, over VOCAB; records what it detokenized."""

    def __init__(self, *, reachable: bool = True, eos_token_ids: Sequence[int] = ()) -> None:
        self.detokenized: list[list[int]] = []
        self.reachable = reachable
        self.eos_token_ids = list(eos_token_ids)
        self.calls: list[str] = []  # Tokenize / RenderChat, in order

    async def GetInfo(
        self, request: tokenizer_pb2.GetInfoRequest, **_call_options: object
    ) -> tokenizer_pb2.TokenizerInfo:
        if not self.reachable:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connection refused"
            )
        return tokenizer_pb2.TokenizerInfo(
            model="m", vocab_size=len(VOCAB) + 1, eos_token_ids=self.eos_token_ids
        )

    async def Detokenize(self, request: tokenizer_pb2.DetokenizeRequest) -> tokenizer_pb2.DetokenizeResponse:
        self.detokenized.append(list(request.token_ids))
        return tokenizer_pb2.DetokenizeResponse(text="".join(VOCAB[i] for i in request.token_ids))

    async def Tokenize(self, request: tokenizer_pb2.TokenizeRequest) -> tokenizer_pb2.TokenizeResponse:
        self.calls.append("Tokenize")
        ids = [i for word in request.text.split("|") for i, text in VOCAB.items() if text == word]
        strs = [VOCAB[i] for i in ids] if request.return_token_strs else []
        return tokenizer_pb2.TokenizeResponse(token_ids=ids, token_strs=strs)

    async def RenderChat(self, request: tokenizer_pb2.RenderChatRequest) -> tokenizer_pb2.RenderChatResponse:
        # One token per message: enough to see the messages arrived in order.
        self.calls.append("RenderChat")
        return tokenizer_pb2.RenderChatResponse(token_ids=[len(m.content[0].text) for m in request.messages])


@dataclass(frozen=True)
class FixedFacts:
    """The fleet's facts as the edge reads them, fixed for a test."""

    current: ModelFacts


def api_context(
    serving: Any,
    *,
    max_model_len: int = 32,
    workers: Any = None,
    tokenizer: Any = None,
    options: ApiOptions | None = None,
    **facts: Any,
) -> ApiContext:
    """What the HTTP app serves, over a scripted serving room and a fake tokenizer."""
    tokenizer = tokenizer or FakeTokenizer()
    return ApiContext(
        serving,
        FixedFacts(ModelFacts("m", max_model_len, **facts)),
        workers,
        tokenizer,
        FakeHealth(getattr(tokenizer, "reachable", True)),
        options or ApiOptions(),
    )


@dataclass(frozen=True)
class FakeHealth:
    """The tokenizer's health as its watch would report it."""

    reachable: bool

    def status(self) -> dict[str, Any]:
        return {"reachable": True} if self.reachable else {"reachable": False, "error": "UNAVAILABLE"}


class ScriptedServing:
    """Serving.generate's shape: replays `events`, then raises `error` (if any) or waits forever
    when `hang` (a stream the client abandons); `closed` is set when the run ends in any way."""

    def __init__(
        self,
        events: Sequence[SequenceEvent | Finished],
        *,
        error: Exception | None = None,
        hang: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        self.events = list(events)
        self.vocab_size = vocab_size
        self.error = error
        self.hang = hang
        self.specs: list[GenerationSpec] = []
        self.closed = asyncio.Event()
        self.waiting = asyncio.Event()

    def check(self, spec: GenerationSpec) -> None:
        if self.vocab_size is not None:
            check_vocabulary(spec, self.vocab_size)

    async def generate(self, spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        self.check(spec)
        self.specs.append(spec)
        try:
            for event in self.events:
                yield event
            if self.error is not None:
                raise self.error
            if self.hang:
                self.waiting.set()
                await asyncio.Event().wait()
        finally:
            self.closed.set()


class TableModel:
    """Serving.generate's shape for one-token steps: a "language model" whose next-token
    probabilities depend only on the last token (`table[last] -> {token: p}`). It answers each
    spec with the most likely token and the top `spec.sampling.logprobs` as TopLogprobs, as a
    worker's greedy one-token generation does; records the specs."""

    def __init__(self, table: dict[int, dict[int, float]]) -> None:
        self.table = table
        self.specs: list[GenerationSpec] = []

    async def generate(self, spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        self.specs.append(spec)
        ranked = sorted(self.table[spec.prompt_token_ids[-1]].items(), key=lambda item: -item[1])
        top = [
            common_pb2.TopLogprob(token_id=token, logprob=math.log(p), rank=rank)
            for rank, (token, p) in enumerate(ranked[: spec.sampling.logprobs], start=1)
        ]
        token, p = ranked[0]
        chosen = common_pb2.TokenLogprob(token_id=token, logprob=math.log(p), rank=1, top=top)
        yield SequenceEvent(0, VOCAB.get(token, ""), [token], [chosen], finish_reason="length")
        yield Finished(prompt_tokens=len(spec.prompt_token_ids), completion_tokens=1, cached_prompt_tokens=0)


def spec(
    *,
    n: int = 1,
    prompt: Sequence[int] = (1, 2),
    request_id: str = "r1",
    prompt_tokens_details: bool = False,
    cache_salt: str = "",
) -> GenerationSpec:
    return GenerationSpec(
        request_id=request_id,
        model="m",
        prompt_token_ids=list(prompt),
        sampling=common_pb2.SamplingParams(n=n),
        stops=[],
        cache_salt=cache_salt,
        prompt_tokens_details=prompt_tokens_details,
    )


def token(token_id: int, logprob: float, *top: tuple[int, float]) -> common_pb2.TokenLogprob:
    """A sampled token's logprob with its alternatives, given best first (rank 1, 2, ...).

    They are stored worst first, as nothing promises the worker sends them in rank order."""
    alternatives = [
        common_pb2.TopLogprob(token_id=t, logprob=lp, rank=rank) for rank, (t, lp) in enumerate(top, 1)
    ]
    return common_pb2.TokenLogprob(token_id=token_id, logprob=logprob, rank=1, top=alternatives[::-1])


class QuietWorkerServicer(worker_pb2_grpc.WorkerServicer):
    """A fake worker's answers to the calls that are not a test's subject (served over real
    gRPC): KV released, empty stats, and `info()` for what the worker serves."""

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model="m", vocab_size=49152, max_model_len=2048, max_num_seqs=8)

    async def ReleaseKv(
        self, request: worker_pb2.ReleaseKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseKvResponse:
        return worker_pb2.ReleaseKvResponse()

    async def GetStats(
        self, request: worker_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        return worker_pb2.WorkerStats()

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return self.info()
