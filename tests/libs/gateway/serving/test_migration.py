"""Request migration (libs/gateway/serving/migration.py) over real gRPC: the real tokenizer service
(SmolLM2's tokenizer) and fake workers that decode greedily from a fixed answer, so a request
whose decode worker fails mid-stream must continue elsewhere with exactly the text, tokens and
logprobs of an uninterrupted run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import grpc.aio
import pytest
from prometheus_client import REGISTRY

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.gateway.common.errors import ApiError, MidStreamError
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from libs.gateway.serving.local_detokenize import load_decoder
from libs.gateway.serving.migration import continuation_request
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from libs.tokenization import Tokenizer, TokenizerConfig
from services.tokenizer.servicer import TokenizerServicer, binding
from tests.fixtures.smollm2 import save_smollm2_tokenizer
from tests.libs.gateway.fakes import QuietWorkerServicer

pytestmark = pytest.mark.anyio
# Multi-byte characters split over several byte-level tokens, so some cut points fall inside
# a character that the detokenizer must hold back across the move.
ANSWER = "Le café coûte 3 €, très cher ! 日本語も大丈夫です。"
PROMPT = "Q"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=save_smollm2_tokenizer(tmp_path_factory.mktemp("tok"))))


@dataclass(frozen=True)
class Fail:
    """A Generate call that fails after `after_chunks` chunks, in one of the ways a worker can."""

    after_chunks: int
    how: str = "unavailable"  # "unavailable", "close" (no complete), "engine_stopped", "internal"


@dataclass
class Script:
    """What each Generate call does, in call order across all workers (None: answers fully)."""

    steps: list[Fail | None] = field(default_factory=list)
    calls: list[tuple[str, worker_pb2.GenerateRequest]] = field(default_factory=list)


class GreedyWorker(QuietWorkerServicer):
    """A deterministic "model": after PROMPT (+ any part of the answer) it emits the rest of
    the answer, `per_chunk` tokens at a time, as greedy decoding continues its own output."""

    def __init__(self, name: str, prompt: list[int], answer: list[int], script: Script) -> None:
        self.name = name
        self.prompt = prompt
        self.answer = answer
        self.script = script
        self.per_chunk = 2
        self.finish_in_chunk = True  # else the last chunk has no finish reason; `complete` ends it

    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        handoff = worker_pb2.KvHandoff(transport="nixl", engine_id=self.name, num_tokens=len(self.prompt))
        return worker_pb2.PrefillResponse(first_token_id=self.answer[0], handoff=handoff)

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        n = len(self.script.calls)
        step = self.script.steps[n] if n < len(self.script.steps) else None
        self.script.calls.append((self.name, request))
        prompt = list(request.prompt_token_ids)
        assert prompt[: len(self.prompt)] == self.prompt
        # Each sequence: (index, what it generated before, what it generates here). Every
        # sequence of an n > 1 request decodes the same greedy answer.
        runs = []
        if request.sequences:  # a moved n > 1 request: the worker shortens each budget
            assert prompt == self.prompt
            for entry in request.sequences:
                done = list(entry.token_ids)
                runs.append((entry.index, done, request.sampling.max_tokens - len(done)))
        else:
            done = prompt[len(self.prompt) :]
            runs = [(i, done, request.sampling.max_tokens) for i in range(request.sampling.n or 1)]
        outs = []
        for index, done, budget in runs:
            assert done == self.answer[: len(done)]
            outs.append((index, self.answer[len(done) :][:budget], len(done)))
        longest = max(len(out) for _, out, _ in outs)
        for i, start in enumerate(range(0, longest, self.per_chunk)):
            if step is not None and i == step.after_chunks:
                async for response in self._fail(step, context):
                    yield response
                return
            for index, out, before in outs:
                if start >= len(out):
                    continue
                ids = out[start : start + self.per_chunk]
                finish = common_pb2.FINISH_REASON_UNSPECIFIED
                if start + self.per_chunk >= len(out) and self.finish_in_chunk:
                    rest = self.answer[before:]
                    finish = (
                        common_pb2.FINISH_REASON_STOP
                        if len(rest) == len(out)
                        else common_pb2.FINISH_REASON_LENGTH
                    )
                logprobs = []
                if request.sampling.HasField("logprobs"):
                    # A value per position in the answer, so misplaced logprobs show.
                    position = before + start
                    logprobs = [
                        common_pb2.TokenLogprob(token_id=t, logprob=-(position + k) / 100, rank=1)
                        for k, t in enumerate(ids)
                    ]
                yield worker_pb2.GenerateResponse(
                    chunk=worker_pb2.TokenChunk(
                        index=index, token_ids=ids, logprobs=logprobs, finish_reason=finish
                    )
                )
        out = [t for _, o, _ in outs for t in o]
        usage = common_pb2.Usage(
            prompt_tokens=len(prompt), completion_tokens=len(out), cached_prompt_tokens=1
        )
        yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))

    async def _fail(
        self, step: Fail, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        if step.how == "unavailable":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "decode worker died")
        codes = {
            "engine_stopped": common_pb2.ERROR_CODE_OVERLOADED,
            "internal": common_pb2.ERROR_CODE_INTERNAL,
        }
        if step.how in codes:
            yield worker_pb2.GenerateResponse(error=common_pb2.Error(code=codes[step.how], message=step.how))
        # "close": the stream just ends, without its complete message.


class Stack:
    """The real tokenizer service and GreedyWorkers on loopback, behind one Serving."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
        self.answer = tokenizer.encode(ANSWER, add_special_tokens=False)
        self.script = Script()
        self.workers: dict[str, GreedyWorker] = {}
        self.servers: list[GrpcServer] = []
        self.local_detokenize = False
        self.pool: WorkerPool | None = None

    async def _serve(self, service: ServiceBinding) -> str:
        server = GrpcServer(ServerConfig(), [service])
        await server.start()
        self.servers.append(server)
        return server.address

    async def pipeline(self, roles: dict[str, int], *, migration_limit: int = 2) -> Serving:
        tokenizer_address = await self._serve(
            binding(TokenizerServicer(self.tokenizer, model="m", max_model_len=2048))
        )
        addresses: dict[Role, list[str]] = {}
        for role, count in roles.items():
            for i in range(count):
                worker = GreedyWorker(f"{role}{i}", self.prompt, self.answer, self.script)
                address = await self._serve(
                    ServiceBinding(
                        "cleave.worker.v1.Worker", worker, worker_pb2_grpc.add_WorkerServicer_to_server
                    )
                )
                self.workers[f"{role}{i}"] = worker
                addresses.setdefault(Role(role), []).append(address)
        self.pool = WorkerPool(addresses)
        await self.pool.start()
        stub = tokenizer_pb2_grpc.TokenizerStub(open_channel(tokenizer_address))
        return Serving(
            self.pool,
            stub,
            create_policy("round_robin"),
            create_policy("round_robin"),
            migration_limit=migration_limit,
            # Both detokenize paths: in the gateway (the tokenizer's decoder) and the stream.
            decoder=await load_decoder(stub) if self.local_detokenize else None,
        )

    def spec(
        self, *, max_tokens: int = 100, stops: list[str] | None = None, **sampling: object
    ) -> GenerationSpec:
        params = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, **sampling)  # type: ignore[arg-type]
        return GenerationSpec("r1", "m", self.prompt, params, stops or [])

    def set_chunking(self, per_chunk: int, finish_in_chunk: bool = True) -> None:
        for worker in self.workers.values():
            worker.per_chunk, worker.finish_in_chunk = per_chunk, finish_in_chunk

    async def reset(self, *steps: Fail | None) -> None:
        """A new script, and every worker healthy again (the poller reinstates ejected ones)."""
        self.script.steps, self.script.calls = list(steps), []
        assert self.pool is not None
        await self.pool.poll_once()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        for server in self.servers:
            await server.stop()


@pytest.fixture(params=["local", "stream"])
async def stack(tokenizer: Tokenizer, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    s = Stack(tokenizer)
    s.local_detokenize = request.param == "local"
    yield s
    await s.close()


@dataclass
class Run:
    text: str
    events: list[SequenceEvent]
    finished: Finished | None

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def logprobs(self) -> list[tuple[int, float]]:
        return [(lp.token_id, round(lp.logprob, 4)) for e in self.events for lp in e.logprobs]


async def run(pipeline: Serving, spec: GenerationSpec) -> Run:
    events, finished = [], None
    async for event in pipeline.generate(spec):
        if isinstance(event, SequenceEvent):
            events.append(event)
        else:
            finished = event
    return Run("".join(e.text for e in events), events, finished)


def migrations() -> float:
    return REGISTRY.get_sample_value("cleave_gateway_migrations_total") or 0.0


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("cleave_gateway_migrations_refused_total", {"reason": reason}) or 0.0


def test_the_continuation_request_extends_the_prompt_and_shrinks_the_budget() -> None:
    original = worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id="r", model="m"),
        prompt_token_ids=[1, 2, 3],
        sampling=common_pb2.SamplingParams(
            max_tokens=10, min_tokens=4, seed=7, logprobs=2, prompt_logprobs=1
        ),
        handoff=worker_pb2.KvHandoff(transport="nixl", num_tokens=3),
    )
    request = continuation_request(original, [8, 9, 10, 11, 12])
    assert list(request.prompt_token_ids) == [1, 2, 3, 8, 9, 10, 11, 12]
    assert request.sampling.max_tokens == 5 and request.sampling.min_tokens == 0
    assert request.sampling.seed == 7 and request.sampling.logprobs == 2
    assert not request.sampling.HasField("prompt_logprobs") and not request.HasField("handoff")
    assert request.metadata.request_id == "r"
    assert list(original.prompt_token_ids) == [1, 2, 3] and original.HasField("handoff")  # untouched


async def test_every_cut_point_continues_with_the_uninterrupted_text_tokens_and_logprobs(
    stack: Stack,
) -> None:
    """One token per chunk, the decode worker killed after each possible number of tokens:
    the client's text, token ids, logprobs and counts equal the uninterrupted run's."""
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    stack.set_chunking(per_chunk=1)
    await stack.reset()
    reference = await run(pipeline, stack.spec(logprobs=0))
    assert reference.text == ANSWER and reference.token_ids == stack.answer
    for cut in range(1, len(stack.answer)):
        await stack.reset(Fail(after_chunks=cut))
        before = migrations()
        moved = await run(pipeline, stack.spec(logprobs=0))
        assert (moved.text, moved.token_ids, moved.logprobs) == (
            reference.text,
            reference.token_ids,
            reference.logprobs,
        ), cut
        assert moved.finished == reference.finished
        assert migrations() - before == 1
        (first, _), (second, continuation) = stack.script.calls
        assert first != second
        assert list(continuation.prompt_token_ids) == stack.prompt + stack.answer[:cut]
        assert continuation.sampling.max_tokens == 100 - cut and not continuation.HasField("handoff")


@pytest.mark.parametrize("how", ["unavailable", "close", "engine_stopped"])
async def test_each_kind_of_worker_failure_moves_the_request(stack: Stack, how: str) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    await stack.reset(Fail(after_chunks=2, how=how))
    moved = await run(pipeline, stack.spec())
    assert moved.text == ANSWER
    assert [name for name, _ in stack.script.calls] in (["decode0", "decode1"], ["decode1", "decode0"])
    # Every admission slot the request took (the first worker's, the second's) was given back.
    assert stack.pool is not None and all(e.admitted == 0 for e in stack.pool.endpoints)


async def test_an_internal_error_mid_stream_is_not_moved(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    await stack.reset(Fail(after_chunks=2, how="internal"))
    with pytest.raises(MidStreamError, match="internal"):
        await run(pipeline, stack.spec())
    assert len(stack.script.calls) == 1


async def test_at_most_migration_limit_moves_then_an_error_naming_the_limit(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 4}, migration_limit=2)
    await stack.reset(Fail(2), Fail(1))
    assert (await run(pipeline, stack.spec())).text == ANSWER
    assert len({name for name, _ in stack.script.calls}) == 3

    await stack.reset(Fail(2), Fail(1), Fail(1))
    before = refused("limit")
    with pytest.raises(MidStreamError, match=r"mid-stream.*--migration-limit 2"):
        await run(pipeline, stack.spec())
    assert len(stack.script.calls) == 3 and refused("limit") - before == 1


async def test_limit_zero_disables_migration(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2}, migration_limit=0)
    await stack.reset(Fail(2))
    with pytest.raises(MidStreamError, match="disabled"):
        await run(pipeline, stack.spec())
    assert len(stack.script.calls) == 1


async def test_no_other_worker_is_the_old_error_event(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 1})
    await stack.reset(Fail(2))
    with pytest.raises(MidStreamError, match=r"decode worker failed mid-stream.*no other healthy"):
        await run(pipeline, stack.spec())


async def test_a_colocated_worker_takes_over_when_no_decode_worker_is_left(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 1, "both": 1})
    await stack.reset(Fail(3))
    assert (await run(pipeline, stack.spec())).text == ANSWER
    assert [name for name, _ in stack.script.calls] == ["decode0", "both0"]


async def test_colocated_workers_migrate_among_themselves(stack: Stack) -> None:
    pipeline = await stack.pipeline({"both": 2})
    await stack.reset(Fail(1))
    assert (await run(pipeline, stack.spec())).text == ANSWER
    assert sorted(name for name, _ in stack.script.calls) == ["both0", "both1"]


async def test_budget_stop_strings_and_usage_carry_over(stack: Stack) -> None:
    """max_tokens ends the moved request where it would have ended; a stop string spanning the
    cut still stops it; usage keeps the original prompt's length when `complete` ends it."""
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    stack.set_chunking(per_chunk=1)
    await stack.reset()
    short = await run(pipeline, stack.spec(max_tokens=6))
    await stack.reset(Fail(3))
    moved = await run(pipeline, stack.spec(max_tokens=6))
    assert moved.text == short.text and moved.events[-1].finish_reason == "length"
    assert moved.finished is not None and moved.finished.completion_tokens == 6

    stop = ["coûte 3"]
    await stack.reset()
    stopped = await run(pipeline, stack.spec(stops=stop))
    assert stopped.text == "Le café "
    cut = next(i for i in range(1, len(stack.answer)) if "co" in stack.tokenizer.decode(stack.answer[:i]))
    await stack.reset(Fail(cut))
    moved = await run(pipeline, stack.spec(stops=stop))
    assert moved.text == stopped.text and moved.events[-1].finish_reason == "stop"

    stack.set_chunking(per_chunk=2, finish_in_chunk=False)
    await stack.reset(Fail(2))
    moved = await run(pipeline, stack.spec())
    assert moved.text == ANSWER and moved.finished is not None
    assert moved.finished.prompt_tokens == len(stack.prompt)
    assert moved.finished.completion_tokens == len(stack.answer)


async def test_n_above_one_moves_every_open_sequence(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    await stack.reset(Fail(2))
    before = migrations()
    moved = await run(pipeline, stack.spec(n=2, logprobs=0))
    assert migrations() - before == 1
    for index in (0, 1):
        events = [e for e in moved.events if e.index == index]
        assert "".join(e.text for e in events) == ANSWER
        # Logprobs in the answer's positions: nothing repeated or missing across the move.
        assert [lp.logprob for e in events for lp in e.logprobs] == pytest.approx(
            [-k / 100 for k in range(len(stack.answer))]
        )
    (_, first), (_, again) = stack.script.calls
    assert first.HasField("handoff") and not again.HasField("handoff")
    # One request: the prompt as it was, each sequence with the 2 chunks x 2 tokens it had.
    assert list(again.prompt_token_ids) == stack.prompt and again.sampling.n == 2
    assert [(s.index, list(s.token_ids)) for s in again.sequences] == [
        (0, stack.answer[:4]),
        (1, stack.answer[:4]),
    ]
    assert moved.finished is not None and moved.finished.completion_tokens == 2 * len(stack.answer)


async def test_structured_output_moves_with_its_tokens_apart_for_the_grammar(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    structured = stack.spec()
    structured.sampling.structured_output.json_object = True
    await stack.reset(Fail(1))
    moved = await run(pipeline, structured)
    assert moved.text == ANSWER
    (_, _), (_, again) = stack.script.calls
    # The prompt as it was, and the sequence's tokens apart: the worker starts the grammar
    # after them (libs/worker/vllm_grammar_prefix.py).
    assert list(again.prompt_token_ids) == stack.prompt and again.sampling.structured_output.json_object
    assert [(s.index, list(s.token_ids)) for s in again.sequences] == [(0, stack.answer[:2])]


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
async def test_penalties_move_with_their_tokens_apart_to_count_as_output(stack: Stack, penalty: str) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    penalized = stack.spec()
    setattr(penalized.sampling, penalty, 0.5)
    await stack.reset(Fail(1))
    moved = await run(pipeline, penalized)
    assert moved.text == ANSWER
    (_, _), (_, again) = stack.script.calls
    # The worker counts them as output for the penalties (libs/worker/vllm_moved_penalties.py).
    assert list(again.prompt_token_ids) == stack.prompt and getattr(again.sampling, penalty) == 0.5
    assert [(s.index, list(s.token_ids)) for s in again.sequences] == [(0, stack.answer[:2])]


async def test_repetition_penalty_alone_moves_as_a_longer_prompt(stack: Stack) -> None:
    """It counts prompt and output tokens alike, so the moved tokens need not stay apart."""
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    penalized = stack.spec()
    penalized.sampling.repetition_penalty = 1.3
    await stack.reset(Fail(1))
    moved = await run(pipeline, penalized)
    assert moved.text == ANSWER
    (_, _), (_, again) = stack.script.calls
    assert list(again.prompt_token_ids) == stack.prompt + stack.answer[:2] and not again.sequences


@pytest.mark.parametrize("how", ["unavailable", "close", "engine_stopped"])
async def test_a_worker_failing_before_its_first_token_hands_the_request_to_another(
    stack: Stack, how: str
) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 2})
    await stack.reset(Fail(0, how=how))
    before = migrations()
    moved = await run(pipeline, stack.spec())
    assert moved.text == ANSWER and migrations() - before == 1
    (first, handed_over), (second, again) = stack.script.calls
    assert first != second
    # Nothing was sent: the same request runs there, computing the prompt (no handoff).
    assert handed_over.HasField("handoff") and not again.HasField("handoff")
    assert list(again.prompt_token_ids) == stack.prompt and again.sampling.max_tokens == 100
    assert stack.pool is not None and all(e.admitted == 0 for e in stack.pool.endpoints)


async def test_before_the_first_token_n_above_one_and_structured_output_move_too(stack: Stack) -> None:
    pipeline = await stack.pipeline({"both": 2})
    structured = stack.spec(prompt_logprobs=1, n=2)
    structured.sampling.structured_output.json_object = True
    await stack.reset(Fail(0))
    moved = await run(pipeline, structured)
    assert ["".join(e.text for e in moved.events if e.index == i) for i in (0, 1)] == [ANSWER, ANSWER]
    (_, first), (_, again) = stack.script.calls
    assert again == first  # prompt logprobs and the constraint included: nothing had run


async def test_no_other_worker_before_the_first_token_is_a_503(stack: Stack) -> None:
    pipeline = await stack.pipeline({"prefill": 1, "decode": 1})
    await stack.reset(Fail(0))
    with pytest.raises(ApiError, match=r"before its first token.*no other healthy") as raised:
        await run(pipeline, stack.spec())
    assert raised.value.status == 503
