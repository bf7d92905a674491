"""The gateway's request path over real gRPC: the real tokenizer service (SmolLM2's
tokenizer) and scripted fake workers, so retries, stop strings, cancellation and failures
are tested in seconds."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc
import grpc.aio
import pytest

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.gateway.common import errors
from libs.gateway.common.deadline import Deadline
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.breaker import BreakerConfig
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.disaggregation import DisaggConfig
from libs.gateway.serving.generate import PrefixLookup, Serving
from libs.gateway.serving.local_detokenize import load_decoder
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from libs.tokenization import Tokenizer, TokenizerConfig
from services.tokenizer.servicer import TokenizerServicer, binding
from tests.fixtures.smollm2 import save_smollm2_tokenizer
from tests.libs.gateway.fakes import QuietWorkerServicer

pytestmark = pytest.mark.anyio
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=save_smollm2_tokenizer(tmp_path_factory.mktemp("tok"))))


class FakeWorker(QuietWorkerServicer):
    def __init__(
        self,
        tokens: list[int],
        *,
        fail_prefill: bool = False,
        die_after_chunks: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.tokens = tokens
        self.fail_prefill = fail_prefill
        self.die_after_chunks = die_after_chunks
        self.delay_s = delay_s
        self.prefills = 0
        self.reject_handoffs = 0  # how many Generate calls answer "lease expired" first
        self.cancelled = asyncio.Event()
        self.released: list[str] = []
        self.generate_had_handoff: list[bool] = []
        self.salts: list[str] = []  # each call's metadata.cache_salt
        self.cached_prompt_tokens = 0  # what the engine found in its prefix cache (usage)

    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        self.prefills += 1
        self.salts.append(request.metadata.cache_salt)
        if self.fail_prefill:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "engine died")
        handoff = worker_pb2.KvHandoff(
            transport="nixl", engine_id="e", num_tokens=len(request.prompt_token_ids)
        )
        return worker_pb2.PrefillResponse(first_token_id=self.tokens[0], handoff=handoff)

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self.generate_had_handoff.append(request.HasField("handoff") and request.handoff.num_tokens > 0)
        self.salts.append(request.metadata.cache_salt)
        if self.reject_handoffs > 0 and request.HasField("handoff"):
            self.reject_handoffs -= 1
            await context.abort(grpc.StatusCode.ABORTED, "the KV handoff's lease expired")
        try:
            for n, start in enumerate(range(0, len(self.tokens), 2)):
                if self.die_after_chunks is not None and n == self.die_after_chunks:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "decode worker died")
                await asyncio.sleep(self.delay_s)
                last = start + 2 >= len(self.tokens)
                finish = common_pb2.FINISH_REASON_STOP if last else common_pb2.FINISH_REASON_UNSPECIFIED
                yield worker_pb2.GenerateResponse(
                    chunk=worker_pb2.TokenChunk(
                        token_ids=self.tokens[start : start + 2], finish_reason=finish
                    )
                )
            usage = common_pb2.Usage(
                prompt_tokens=len(request.prompt_token_ids),
                completion_tokens=len(self.tokens),
                cached_prompt_tokens=self.cached_prompt_tokens,
            )
            yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def ReleaseKv(
        self, request: worker_pb2.ReleaseKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseKvResponse:
        self.released.append(request.request_id)
        return worker_pb2.ReleaseKvResponse()


class Stack:
    """Real gRPC servers on loopback: the tokenizer service and fake workers."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.servers: list[GrpcServer] = []
        self.local_detokenize = False

    async def _serve(self, service: ServiceBinding) -> str:
        server = GrpcServer(ServerConfig(), [service])
        await server.start()
        self.servers.append(server)
        return server.address

    async def pipeline(
        self,
        roles: dict[str, list[FakeWorker]],
        prefix_lookup: PrefixLookup | None = None,
        disagg: DisaggConfig | None = None,
    ) -> tuple[Serving, WorkerPool]:
        tokenizer_address = await self._serve(
            binding(TokenizerServicer(self.tokenizer, model="m", max_model_len=2048))
        )
        addresses = {
            Role(role): [
                await self._serve(
                    ServiceBinding("cleave.worker.v1.Worker", w, worker_pb2_grpc.add_WorkerServicer_to_server)
                )
                for w in workers
            ]
            for role, workers in roles.items()
        }
        # One failure stops routing to a worker, so each test sees the breaker act at once.
        pool = WorkerPool(addresses, breaker=BreakerConfig(failures_to_open=1))
        await pool.start()
        stub = tokenizer_pb2_grpc.TokenizerStub(open_channel(tokenizer_address))
        policies = create_policy("round_robin"), create_policy("least_load")
        # The gateway detokenizes in-process when the tokenizer gives its decoder; every test
        # runs both ways, so the two give the same events (`detokenize` parametrizes `stack`).
        decoder = await load_decoder(stub) if self.local_detokenize else None
        assert (decoder is not None) == self.local_detokenize
        pipeline = Serving(pool, stub, *policies, prefix_lookup=prefix_lookup, decoder=decoder, disagg=disagg)
        return pipeline, pool

    async def close(self) -> None:
        for server in self.servers:
            await server.stop()


@pytest.fixture(params=["local", "stream"])
async def stack(tokenizer: Tokenizer, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    s = Stack(tokenizer)
    s.local_detokenize = request.param == "local"
    yield s
    await s.close()


def spec(tokenizer: Tokenizer, stops: list[str] | None = None) -> GenerationSpec:
    return GenerationSpec(
        "r1",
        "m",
        tokenizer.encode("Q", add_special_tokens=False),
        common_pb2.SamplingParams(max_tokens=50),
        stops or [],
    )


async def run(pipeline: Serving, request: GenerationSpec) -> tuple[str, list[SequenceEvent], Finished | None]:
    events, finished = [], None
    async for event in pipeline.generate(request):
        if isinstance(event, SequenceEvent):
            events.append(event)
        else:
            finished = event
    return "".join(e.text for e in events), events, finished


async def test_disaggregated_path_streams_the_answer(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]})
    text, events, finished = await run(pipeline, spec(tokenizer))
    await pool.close()
    assert text == ANSWER
    assert events[-1].finish_reason == "stop"
    assert finished is not None and finished.completion_tokens == len(tokens)
    assert prefill.prefills == 1


async def test_conditional_disaggregation_keeps_short_prompts_on_decode(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    conditional = DisaggConfig(policy="conditional", local_prefill_max_tokens=100)
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]}, disagg=conditional)
    short = spec(tokenizer)
    long = replace(short, request_id="r2", prompt_token_ids=short.prompt_token_ids * 101)
    short_text, _, _ = await run(pipeline, short)
    assert (prefill.prefills, decode.generate_had_handoff) == (0, [False])  # no handoff
    long_text, _, _ = await run(pipeline, long)
    await pool.close()
    assert (prefill.prefills, decode.generate_had_handoff) == (1, [False, True])
    assert short_text == long_text == ANSWER


async def test_conditional_disaggregation_without_prefill_workers_prefills_on_decode(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    decode = FakeWorker(tokens)
    conditional = DisaggConfig(policy="conditional", local_prefill_max_tokens=0)
    pipeline, pool = await stack.pipeline({"prefill": [], "decode": [decode]}, disagg=conditional)
    text, _, _ = await run(pipeline, spec(tokenizer))
    await pool.close()
    assert text == ANSWER and decode.generate_had_handoff == [False]


async def test_prefill_retries_on_another_worker_and_ejects_the_dead_one(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    dead, alive, decode = FakeWorker(tokens, fail_prefill=True), FakeWorker(tokens), FakeWorker(tokens)
    pipeline, pool = await stack.pipeline({"prefill": [dead, alive], "decode": [decode]})
    results = [await run(pipeline, spec(tokenizer)) for _ in range(3)]
    healthy = [e.address for e in pool.healthy(Role.PREFILL)]
    await pool.close()
    assert all(text == ANSWER for text, _, _ in results)
    assert dead.prefills == 1  # tried once, then ejected
    assert len(healthy) == 1


async def test_stop_string_across_tokens_cancels_decode(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER + " It is a big city with many museums.", add_special_tokens=False)
    decode = FakeWorker(tokens, delay_s=0.05)
    pipeline, pool = await stack.pipeline({"prefill": [FakeWorker(tokens)], "decode": [decode]})
    text, events, _ = await run(pipeline, spec(tokenizer, stops=["is Par"]))
    await asyncio.wait_for(decode.cancelled.wait(), 5)
    await pool.close()
    assert text == "The capital of France "
    assert events[-1].finish_reason == "stop"


async def test_when_the_engine_ends_the_stream_its_usage_counts_the_cached_prompt_tokens(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    """The engine's own finish is followed by its `complete`: the gateway reads it (its cached
    tokens are what --enable-prompt-tokens-details reports) instead of cancelling the call."""
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    decode = FakeWorker(tokens)
    decode.cached_prompt_tokens = 1
    pipeline, pool = await stack.pipeline({"both": [decode]})
    _, events, finished = await run(pipeline, spec(tokenizer))
    await pool.close()
    assert events[-1].finish_reason == "stop"
    assert finished is not None and finished.cached_prompt_tokens == 1
    assert not decode.cancelled.is_set()


async def test_decode_dying_mid_stream_is_an_error_not_a_hang(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    decode = FakeWorker(tokens, die_after_chunks=2)
    pipeline, pool = await stack.pipeline({"prefill": [FakeWorker(tokens)], "decode": [decode]})
    with pytest.raises(MidStreamError, match="mid-stream"):
        await asyncio.wait_for(run(pipeline, spec(tokenizer)), 10)
    assert pool.healthy(Role.DECODE) == []
    await pool.close()


async def test_no_workers_is_503_and_unconsumed_handoff_is_released(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    pipeline, pool = await stack.pipeline({"prefill": [], "decode": []})
    with pytest.raises(errors.ApiError) as info:
        await run(pipeline, spec(tokenizer))
    assert info.value.status == 503
    await pool.close()
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    decode = FakeWorker(tokens, die_after_chunks=0)
    pipeline, pool = await stack.pipeline({"prefill": [FakeWorker(tokens)], "decode": [decode]})
    with pytest.raises(errors.ApiError):
        await run(pipeline, spec(tokenizer))
    await pool.close()
    assert decode.released == ["r1"]


async def test_rejected_handoff_is_prefilled_again(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    decode.reject_handoffs = 1
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]})
    text, _, _ = await run(pipeline, spec(tokenizer))
    await pool.close()
    assert text == ANSWER
    assert prefill.prefills == 2


class StoredPrefix:
    """A kvstore lookup that answers a fixed number of matched tokens."""

    def __init__(self, matched: int) -> None:
        self.matched = matched
        self.asked: list[str] = []
        self.salts: list[str] = []

    async def matched_tokens(
        self, request_id: str, token_ids: Sequence[int], cache_salt: str = "", lora: object = None
    ) -> int:
        self.asked.append(request_id)
        self.salts.append(cache_salt)
        return min(self.matched, len(token_ids))


async def test_a_prompt_the_kvstore_holds_skips_prefill(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    lookup = StoredPrefix(matched=10_000)
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]}, prefix_lookup=lookup)
    text, _, _ = await run(pipeline, spec(tokenizer))
    await pool.close()
    assert text == ANSWER and lookup.asked == ["r1"]
    assert prefill.prefills == 0 and decode.generate_had_handoff == [False]


async def test_the_cache_salt_reaches_the_kvstore_lookup_prefill_and_decode(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    lookup = StoredPrefix(matched=0)
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]}, prefix_lookup=lookup)
    await run(pipeline, dataclasses.replace(spec(tokenizer), cache_salt="tenant-a"))
    await run(pipeline, spec(tokenizer))
    await pool.close()
    assert lookup.salts == prefill.salts == decode.salts == ["tenant-a", ""]


async def test_a_long_uncached_tail_still_goes_through_prefill(stack: Stack, tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = FakeWorker(tokens), FakeWorker(tokens)
    long_prompt = GenerationSpec("r2", "m", list(range(600)), common_pb2.SamplingParams(max_tokens=50), [])
    pipeline, pool = await stack.pipeline(
        {"prefill": [prefill], "decode": [decode]}, prefix_lookup=StoredPrefix(256)
    )
    await run(pipeline, long_prompt)
    await pool.close()
    assert prefill.prefills == 1 and decode.generate_had_handoff == [True]


async def test_a_request_past_its_deadline_is_504_and_the_worker_sees_its_call_cancelled(
    stack: Stack, tokenizer: Tokenizer
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    decode = FakeWorker(tokens, delay_s=60)  # slower than the request's deadline
    pipeline, pool = await stack.pipeline({"prefill": [FakeWorker(tokens)], "decode": [decode]})
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, replace(spec(tokenizer), deadline=Deadline.after(0.5)))
    assert (raised.value.status, raised.value.code) == (504, "request_timeout")
    # gRPC carried the deadline: the worker's call was cancelled (a real worker aborts the
    # request in its engine), and the worker is not blamed.
    await asyncio.wait_for(decode.cancelled.wait(), 5)
    assert len(pool.healthy(Role.DECODE)) == 1
    await pool.close()
