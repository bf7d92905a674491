"""Whose fault a failure is, on the gateway's request path (real gRPC on loopback, scripted
workers and tokenizer): a request a worker refuses as invalid is a 400 with the worker's
message and never ejects it; tokenizer failures are the tokenizer's; only a worker's own
failures eject it. Also the edge checks that keep client mistakes away from the workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pydantic
import pytest

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.common import errors
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.breaker import BreakerConfig
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from tests.libs.gateway.fakes import QuietWorkerServicer

pytestmark = pytest.mark.anyio
VOCAB_SIZE = 100
TOKENS = [10, 11, 12, 13]


class ScriptedWorker(QuietWorkerServicer):
    """Answers with TOKENS, or with the status set in `prefill_status` / `generate_status`."""

    def __init__(self, *, vocab_size: int = VOCAB_SIZE) -> None:
        self.vocab_size = vocab_size
        self.prefill_status: tuple[grpc.StatusCode, str] | None = None
        self.generate_status: tuple[grpc.StatusCode, str] | None = None
        self.prefills = 0
        self.generates = 0

    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        self.prefills += 1
        if self.prefill_status is not None:
            await context.abort(*self.prefill_status)
        handoff = worker_pb2.KvHandoff(transport="nixl", num_tokens=len(request.prompt_token_ids))
        return worker_pb2.PrefillResponse(first_token_id=TOKENS[0], handoff=handoff)

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self.generates += 1
        if self.generate_status is not None:
            await context.abort(*self.generate_status)
        yield worker_pb2.GenerateResponse(
            chunk=worker_pb2.TokenChunk(token_ids=TOKENS, finish_reason=common_pb2.FINISH_REASON_LENGTH)
        )
        usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=len(TOKENS))
        yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(vocab_size=self.vocab_size, max_model_len=2048)


class ScriptedTokenizer(tokenizer_pb2_grpc.TokenizerServicer):
    """Detokenizes id N as "<N>"; `stream_status` makes DetokenizeStream fail instead, once
    it has read `start` and the first tokens (the client writes both before it reads: ending
    the call earlier makes grpcio's client report INTERNAL, grpc/grpc#36066)."""

    def __init__(self) -> None:
        self.stream_status: tuple[grpc.StatusCode, str] | None = None

    async def DetokenizeStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tokenizer_pb2.DetokenizeStreamResponse]:
        requests = aiter(request_iterator)
        if self.stream_status is not None:
            await anext(requests, None)
            await anext(requests, None)
            await context.abort(*self.stream_status)
        async for message in requests:
            kind = message.WhichOneof("kind")
            if kind == "tokens":
                text = "".join(f"<{t}>" for t in message.tokens.token_ids)
                yield tokenizer_pb2.DetokenizeStreamResponse(delta=tokenizer_pb2.TextDelta(text=text))
            elif kind == "finish":
                yield tokenizer_pb2.DetokenizeStreamResponse(complete=tokenizer_pb2.DetokenizeComplete())
                return


class Stack:
    def __init__(self) -> None:
        self.servers: list[GrpcServer] = []
        self.tokenizer = ScriptedTokenizer()
        self.pools: list[WorkerPool] = []

    async def _serve(self, binding: ServiceBinding) -> str:
        server = GrpcServer(ServerConfig(), [binding])
        await server.start()
        self.servers.append(server)
        return server.address

    async def pipeline(self, roles: dict[str, list[ScriptedWorker]]) -> tuple[Serving, WorkerPool]:
        tokenizer_address = await self._serve(
            ServiceBinding(
                "cleave.tokenizer.v1.Tokenizer",
                self.tokenizer,
                tokenizer_pb2_grpc.add_TokenizerServicer_to_server,
            )
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
        self.pools.append(pool)
        stub = tokenizer_pb2_grpc.TokenizerStub(open_channel(tokenizer_address))
        return Serving(pool, stub, create_policy("round_robin"), create_policy("round_robin")), pool

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()
        for server in self.servers:
            await server.stop()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    s = Stack()
    yield s
    await s.close()


def spec(**sampling: Any) -> GenerationSpec:
    return GenerationSpec("r1", "m", [1, 2, 3], common_pb2.SamplingParams(max_tokens=8, **sampling), [])


async def run(pipeline: Serving, request: GenerationSpec) -> str:
    text = ""
    async for event in pipeline.generate(request):
        if isinstance(event, SequenceEvent):
            text += event.text
        else:
            assert isinstance(event, Finished)
    return text


def healthy(pool: WorkerPool) -> dict[str, int]:
    return {role: len(pool.healthy(role)) for role in (Role.PREFILL, Role.DECODE)}


ENGINE_MESSAGE = "token_id(s) [99999] in logit_bias contain out-of-vocab token ids. Vocabulary size: 100"


async def test_a_prefill_refusing_the_request_is_400_and_the_worker_stays(stack: Stack) -> None:
    prefill, decode = ScriptedWorker(vocab_size=0), ScriptedWorker(vocab_size=0)  # no edge check
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]})
    prefill.prefill_status = (grpc.StatusCode.INVALID_ARGUMENT, ENGINE_MESSAGE)
    for _ in range(3):
        with pytest.raises(errors.ApiError) as raised:
            await run(pipeline, spec())
        assert (raised.value.status, raised.value.message, raised.value.type) == (
            400, ENGINE_MESSAGE, "invalid_request_error"
        )  # fmt: skip
    assert prefill.prefills == 3  # never retried: another worker would refuse it too
    assert healthy(pool) == {"prefill": 1, "decode": 1}
    prefill.prefill_status = None
    assert await run(pipeline, spec()) == "<10><11><12><13>"


async def test_a_decode_refusing_the_request_is_400_and_the_worker_stays(stack: Stack) -> None:
    decode = ScriptedWorker(vocab_size=0)
    pipeline, pool = await stack.pipeline({"prefill": [ScriptedWorker(vocab_size=0)], "decode": [decode]})
    decode.generate_status = (grpc.StatusCode.INVALID_ARGUMENT, "temperature must be in [0, 2], got 7.0.")
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert raised.value.status == 400 and "temperature" in raised.value.message
    assert healthy(pool) == {"prefill": 1, "decode": 1}


async def test_an_internal_error_is_retried_elsewhere_without_ejecting(stack: Stack) -> None:
    buggy, fine = ScriptedWorker(), ScriptedWorker()
    pipeline, pool = await stack.pipeline({"prefill": [buggy, fine], "decode": [ScriptedWorker()]})
    buggy.prefill_status = (grpc.StatusCode.INTERNAL, "internal error in the worker service")
    for _ in range(2):
        assert await run(pipeline, spec()) == "<10><11><12><13>"
    assert buggy.prefills >= 1
    assert healthy(pool) == {"prefill": 2, "decode": 1}


async def test_an_unavailable_worker_is_ejected_and_the_request_goes_elsewhere(stack: Stack) -> None:
    dead, alive = ScriptedWorker(), ScriptedWorker()
    pipeline, pool = await stack.pipeline({"prefill": [dead, alive], "decode": [ScriptedWorker()]})
    dead.prefill_status = (grpc.StatusCode.UNAVAILABLE, "the engine died")
    assert [await run(pipeline, spec()) for _ in range(2)] == ["<10><11><12><13>"] * 2
    assert healthy(pool) == {"prefill": 1, "decode": 1}


async def test_the_only_prefill_worker_failing_answers_its_failure_not_no_healthy_worker(
    stack: Stack,
) -> None:
    # A CI run answered "no healthy prefill worker is available" for a request the only
    # prefill worker had failed: the client (and the operator reading it) learnt nothing.
    only = ScriptedWorker()
    pipeline, pool = await stack.pipeline({"prefill": [only], "decode": [ScriptedWorker()]})
    only.prefill_status = (grpc.StatusCode.INTERNAL, "internal error in the worker service")
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert (raised.value.status, raised.value.message) == (
        500,
        "worker error: internal error in the worker service",
    )
    assert only.prefills == 1 and healthy(pool) == {"prefill": 1, "decode": 1}
    only.prefill_status = (grpc.StatusCode.UNAVAILABLE, "the engine died")
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert raised.value.status == 503 and raised.value.code != "no_healthy_workers"


async def test_an_unavailable_workers_transport_details_stay_out_of_the_clients_error(stack: Stack) -> None:
    # gRPC's UNAVAILABLE details name the peer's internal address (found on a compose stack:
    # "ipv4:172.28.15.5:50060: Connection refused" reached the client).
    dead = ScriptedWorker()
    pipeline, _ = await stack.pipeline({"prefill": [ScriptedWorker()], "decode": [dead]})
    dead.generate_status = (
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect: ipv4:172.28.15.5:50060: Connection refused",
    )
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert raised.value.status == 503
    assert "172.28" not in raised.value.message and "50060" not in raised.value.message


@pytest.mark.parametrize(
    ("status", "http_status", "code"),
    [
        (grpc.StatusCode.UNAVAILABLE, 503, "tokenizer_unavailable"),
        (grpc.StatusCode.INTERNAL, 503, "tokenizer_unavailable"),
        (grpc.StatusCode.INVALID_ARGUMENT, 400, None),
    ],
)
async def test_tokenizer_stream_failures_are_the_tokenizers_not_the_decode_workers(
    stack: Stack, status: grpc.StatusCode, http_status: int, code: str | None
) -> None:
    pipeline, pool = await stack.pipeline({"prefill": [ScriptedWorker()], "decode": [ScriptedWorker()]})
    stack.tokenizer.stream_status = (status, "tokenizer says no")
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert (raised.value.status, raised.value.code) == (http_status, code)
    if http_status == 503:
        assert "tokenizer" in raised.value.message
    assert healthy(pool) == {"prefill": 1, "decode": 1}
    stack.tokenizer.stream_status = None
    assert await run(pipeline, spec()) == "<10><11><12><13>"


async def test_a_stopped_tokenizer_is_503_naming_it_and_ejects_no_worker(stack: Stack) -> None:
    pipeline, pool = await stack.pipeline({"prefill": [ScriptedWorker()], "decode": [ScriptedWorker()]})
    await stack.servers[0].stop()  # the tokenizer: served first
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, spec())
    assert raised.value.status == 503 and raised.value.code == "tokenizer_unavailable"
    assert healthy(pool) == {"prefill": 1, "decode": 1}


@pytest.mark.parametrize(
    ("request_spec", "param", "message"),
    [
        # A prompt's id gets vLLM's own message (its test_out_of_vocab_token_ids reads it).
        (
            GenerationSpec("r", "m", [1, 100], common_pb2.SamplingParams(max_tokens=4), []),
            "prompt",
            "Token id 100 is out of vocabulary",
        ),
        (spec(logit_bias={99999: 5.0}), "logit_bias", f"[0, {VOCAB_SIZE})"),
        (spec(stop_token_ids=[7, 250]), "stop_token_ids", f"[0, {VOCAB_SIZE})"),
    ],
)
async def test_token_ids_outside_the_workers_vocabulary_are_refused_at_the_edge(
    stack: Stack, request_spec: GenerationSpec, param: str, message: str
) -> None:
    prefill, decode = ScriptedWorker(), ScriptedWorker()
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]})
    assert pool.vocab_size() == VOCAB_SIZE
    with pytest.raises(errors.ApiError) as raised:
        await run(pipeline, request_spec)
    assert (raised.value.status, raised.value.param) == (400, param)
    assert message in raised.value.message
    assert prefill.prefills == 0 and decode.generates == 0


def test_the_pool_knows_the_smallest_vocabulary_and_nothing_before_workers_answer() -> None:
    assert WorkerPool({}).vocab_size() is None


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 2**40}, "top_k"),
        ({"logit_bias": {"5": float("nan")}}, "logit_bias"),
        ({"stop": ""}, "stop"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"prompt": [2**40]}, "prompt"),
        ({"prompt": [[1, -2]]}, "prompt"),
    ],
)
def test_edge_checks_refuse_what_the_contract_or_the_engine_cannot_take(
    fields: dict[str, Any], location: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as raised:
        CompletionRequest(**{"model": "m", "prompt": "hi", **fields})
    assert raised.value.errors()[0]["loc"][0] == location


def test_edge_checks_accept_what_vllm_accepts() -> None:
    body = CompletionRequest(
        model="m", prompt=[0, 5], seed=2**63 - 1, top_k=-1, logit_bias={"0": -100.0}, stop=["a"] * 16
    )
    assert body.seed == 2**63 - 1 and body.stops() == ["a"] * 16
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": -(2**63)}
    )
    assert chat.seed == -(2**63)
