"""The output router: vLLM's engine-core outputs (its own message types) become each request's
EngineSteps — tokens, finish, n > 1 sequences, logprobs as vLLM's output processor reads them,
prompt logprobs gathered over prefill chunks — and an engine failure reaches every reader."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.outputs import LogprobsLists, LogprobsTensors

from libs.worker.engine import EngineStep
from libs.worker.vllm_logprobs import sample_logprobs
from libs.worker.vllm_outputs import OutputRouter, RequestStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Client:
    def __init__(self) -> None:
        self.outputs: asyncio.Queue[Any] = asyncio.Queue()

    async def get_output_async(self) -> EngineCoreOutputs:
        item = await self.outputs.get()
        if isinstance(item, BaseException):
            raise item
        return item


class _Loggers:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, **kwargs: Any) -> None:
        self.records.append(kwargs)


def request(request_id: str, **params: Any) -> Any:
    return SimpleNamespace(request_id=request_id, sampling_params=SamplingParams(**params), arrival_time=0.0)


def step_of(*outputs: EngineCoreOutput) -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=list(outputs), timestamp=1.0)


async def setup(
    num_sequences: int = 1, *, remote_cached: int | None = None, **params: Any
) -> tuple[_Client, _Loggers, OutputRouter, RequestStream]:
    client, loggers = _Client(), _Loggers()
    router = OutputRouter(client, loggers, SimpleNamespace(stat_mm_cache=lambda: None))
    stream = RequestStream(
        prompt_len=3, num_sequences=num_sequences, remote_cached_tokens=remote_cached, expanded_prompt=None
    )
    ids = [f"{i}_r" for i in range(num_sequences)] if num_sequences > 1 else ["r"]
    router.add(stream, [(i, request(rid, **params)) for i, rid in enumerate(ids)], None, external_id="r")
    return client, loggers, router, stream


async def read(stream: RequestStream) -> list[EngineStep]:
    steps: list[EngineStep] = []
    while not (steps and steps[-1].finished):
        await asyncio.wait_for(stream.wait(), 5)
        if stream.error is not None and not stream.pending:
            raise stream.error
        steps.extend(stream.take())
    return steps


async def test_tokens_then_the_finish_reach_the_stream_and_the_stat_loggers() -> None:
    client, loggers, router, stream = await setup(max_tokens=3)
    client.outputs.put_nowait(step_of(EngineCoreOutput("r", [5])))
    client.outputs.put_nowait(
        step_of(EngineCoreOutput("r", [6, 7], finish_reason=FinishReason.STOP, stop_reason=7))
    )
    steps = await read(stream)
    assert [s.sequences[0].token_ids for s in steps] == [(5,), (6, 7)]
    assert [s.finished for s in steps] == [False, True]
    assert (steps[-1].sequences[0].finish_reason, steps[-1].sequences[0].stop_token_id) == ("stop", 7)
    assert steps[0].num_prompt_tokens == 3
    await asyncio.sleep(0)
    finished = [r["iteration_stats"].finished_requests for r in loggers.records]
    assert sum(len(f) for f in finished) == 1  # vLLM's own stats saw the request end
    assert router.forget(["r"]) == []  # a finished request is no longer routed
    router.stop()


async def test_n_sequences_share_one_stream_which_ends_with_the_last() -> None:
    client, _, router, stream = await setup(2, max_tokens=2, temperature=1.0)
    client.outputs.put_nowait(step_of(EngineCoreOutput("0_r", [1]), EngineCoreOutput("1_r", [2])))
    client.outputs.put_nowait(step_of(EngineCoreOutput("1_r", [3], finish_reason=FinishReason.LENGTH)))
    client.outputs.put_nowait(step_of(EngineCoreOutput("0_r", [4], finish_reason=FinishReason.LENGTH)))
    steps = await read(stream)
    assert [(s.sequences[0].index, s.sequences[0].token_ids, s.finished) for s in steps] == [
        (0, (1,), False),
        (1, (2,), False),
        (1, (3,), False),
        (0, (4,), True),
    ]
    router.stop()


def _lists(ids: list[list[int]], logprobs: list[list[float]], ranks: list[int]) -> LogprobsLists:
    return LogprobsLists(np.array(ids), np.array(logprobs, dtype=np.float32), np.array(ranks))


def test_each_request_keeps_its_own_top_k_and_the_sampled_token_with_its_rank() -> None:
    # The batch asked for 3 top logprobs (another request); this one for 1. The sampled token
    # 9 is ranked 4th: it is kept, with rank 4, beside the top 1.
    lists = _lists([[9, 1, 2, 3]], [[-2.0, -0.5, -1.0, -1.5]], [4])
    (position,) = sample_logprobs(lists, 1)
    assert (position.token_id, position.rank) == (9, 4)
    assert [(t.token_id, t.rank) for t in position.top] == [(1, 1), (9, 4)]
    # The sampled token among the top: one entry, its rank.
    (position,) = sample_logprobs(_lists([[1, 1, 2, 3]], [[-0.5, -0.5, -1.0, -1.5]], [1]), 2)
    assert [(t.token_id, t.rank) for t in position.top] == [(1, 1), (2, 2)]


async def test_prompt_logprobs_from_every_prefill_chunk_arrive_with_the_first_token() -> None:
    client, _, router, stream = await setup(max_tokens=1, prompt_logprobs=0)

    def chunk(token_ids: list[int]) -> LogprobsTensors:
        count = len(token_ids)
        return LogprobsTensors(
            torch.tensor([[t] for t in token_ids]),
            torch.full((count, 1), -1.0),
            torch.ones(count, dtype=torch.long),
        )

    # Two prefill chunks: the first with no token for the reader.
    client.outputs.put_nowait(step_of(EngineCoreOutput("r", [], new_prompt_logprobs_tensors=chunk([11]))))
    client.outputs.put_nowait(
        step_of(
            EngineCoreOutput(
                "r", [5], new_prompt_logprobs_tensors=chunk([12]), finish_reason=FinishReason.LENGTH
            )
        )
    )
    (step,) = await read(stream)
    assert step.prompt_logprobs is not None
    assert step.prompt_logprobs[0] is None  # vLLM's convention for the first prompt token
    assert [p.token_id for p in step.prompt_logprobs[1:] if p is not None] == [11, 12]
    router.stop()


async def test_a_decode_reports_the_prefills_cached_tokens() -> None:
    client, _, router, stream = await setup(remote_cached=2, max_tokens=1)
    client.outputs.put_nowait(step_of(EngineCoreOutput("r", [5], finish_reason=FinishReason.LENGTH)))
    (step,) = await read(stream)
    assert step.num_cached_tokens == 2
    router.stop()


async def test_a_dead_engine_fails_every_reader() -> None:
    client, _, router, stream = await setup(max_tokens=4)
    client.outputs.put_nowait(EngineDeadError())
    with pytest.raises(EngineDeadError):
        await read(stream)
    await asyncio.sleep(0)
    assert router.stopped and isinstance(router.error, EngineDeadError)
