"""VllmEngine over vLLM's engine-core client: n > 1 runs as vLLM's child requests, a reader
that leaves aborts what still runs, and the worker's abort ends the request's stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

from libs.worker.vllm_engine import VllmEngine
from libs.worker.vllm_moved_penalties import MOVED_PENALTIES

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Client:
    def __init__(self) -> None:
        self.resources = SimpleNamespace(engine_dead=False)
        self.outputs: asyncio.Queue[EngineCoreOutputs] = asyncio.Queue()
        self.added: list[Any] = []
        self.aborted: list[str] = []

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def add_request_async(self, request: Any) -> None:
        self.added.append(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)

    async def get_output_async(self) -> EngineCoreOutputs:
        return await self.outputs.get()


class _Inputs:
    async def process_inputs_async(self, request_id: str, prompt: Any, params: Any, **_: Any) -> Any:
        return SimpleNamespace(
            request_id=request_id,
            external_req_id=None,
            prompt_token_ids=prompt["prompt_token_ids"],
            sampling_params=params,
            params=params,
            arrival_time=0.0,
        )

    @staticmethod
    def assign_request_id(request: Any) -> None:
        request.external_req_id = request.request_id
        request.request_id = f"{request.request_id}-x"


def engine() -> tuple[VllmEngine, _Client]:
    client = _Client()
    loggers = SimpleNamespace(record=lambda **_: None)
    parts = SimpleNamespace(
        client=client,
        input_processor=_Inputs(),
        loggers=loggers,
        renderer=SimpleNamespace(stat_mm_cache=lambda: None),
        vllm_config=SimpleNamespace(model_config=None),
        moved_penalties=True,
    )
    return VllmEngine(parts, stats=None, info=None), client  # type: ignore[arg-type]


async def test_n_sequences_run_as_vllms_child_requests_with_their_own_seeds() -> None:
    llm, client = engine()
    steps = llm.generate("r", [1, 2], {"n": 2, "max_tokens": 1, "seed": 7, "detokenize": False})
    reader = asyncio.ensure_future(_all(steps))
    await _until(lambda: len(client.added) == 2)
    assert [r.request_id for r in client.added] == ["0_r-x", "1_r-x"]
    assert [r.sampling_params.seed for r in client.added] == [7, 8]  # vLLM's ParentRequest
    client.outputs.put_nowait(
        EngineCoreOutputs(
            outputs=[
                EngineCoreOutput("0_r-x", [3], finish_reason=FinishReason.LENGTH),
                EngineCoreOutput("1_r-x", [4], finish_reason=FinishReason.LENGTH),
            ]
        )
    )
    steps_read = await asyncio.wait_for(reader, 5)
    assert sorted((s.sequences[0].index, s.sequences[0].token_ids) for s in steps_read) == [
        (0, (3,)),
        (1, (4,)),
    ]
    assert client.aborted == []  # both finished: nothing to abort


async def test_a_reader_that_leaves_early_aborts_its_request_in_the_engine() -> None:
    llm, client = engine()
    steps = cast(AsyncGenerator[Any, None], llm.generate("r", [1, 2], {"max_tokens": 8, "detokenize": False}))
    client.outputs.put_nowait(EngineCoreOutputs(outputs=[EngineCoreOutput("r-x", [3])]))
    first = await asyncio.wait_for(anext(steps), 5)
    assert first.sequences[0].token_ids == (3,)
    await steps.aclose()
    assert client.aborted == ["r-x"]


async def test_the_workers_abort_ends_the_stream_and_frees_the_request() -> None:
    llm, client = engine()
    reader = asyncio.ensure_future(_all(llm.generate("r", [1, 2], {"max_tokens": 8, "detokenize": False})))
    await _until(lambda: len(client.added) == 1)
    await llm.abort("r")
    steps = await asyncio.wait_for(reader, 5)
    assert steps[-1].finished and steps[-1].sequences[0].finish_reason == "abort"
    assert client.aborted == ["r-x"]


async def _all(steps: Any) -> list[Any]:
    return [step async for step in steps]


async def _until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_a_moved_requests_sequences_continue_from_their_own_tokens() -> None:
    llm, client = engine()
    sampling = {
        "n": 3, "max_tokens": 10, "min_tokens": 4, "seed": 7, "temperature": 1.0, "detokenize": False,
        "presence_penalty": 0.5,
    }  # fmt: skip
    reader = asyncio.ensure_future(
        _all(llm.generate("r", [1, 2], sampling, sequences=[(0, [5, 6]), (2, [7])]))
    )
    await _until(lambda: len(client.added) == 2)
    first, second = client.added
    assert (first.request_id, first.prompt_token_ids) == ("0_r-x", [1, 2, 5, 6])
    assert (second.request_id, second.prompt_token_ids) == ("2_r-x", [1, 2, 7])
    params = [
        (r.sampling_params.n, r.sampling_params.max_tokens, r.sampling_params.min_tokens)
        for r in client.added
    ]
    assert params == [(1, 8, 2), (1, 9, 3)]
    assert [r.sampling_params.seed for r in client.added] == [7, 9]  # vLLM's seed of each sequence
    # The penalties count each sequence's own tokens as output (vllm_moved_penalties).
    assert [r.sampling_params.presence_penalty for r in client.added] == [0.0, 0.0]
    assert [r.sampling_params.extra_args[MOVED_PENALTIES]["moved"] for r in client.added] == [2, 1]
    client.outputs.put_nowait(
        EngineCoreOutputs(
            outputs=[
                EngineCoreOutput("0_r-x", [3], finish_reason=FinishReason.LENGTH),
                EngineCoreOutput("2_r-x", [4], finish_reason=FinishReason.LENGTH),
            ]
        )
    )
    steps = await asyncio.wait_for(reader, 5)
    # Each continues under its own index; the prompt is the request's, not a sequence's.
    assert sorted((s.sequences[0].index, s.sequences[0].token_ids) for s in steps) == [(0, (3,)), (2, (4,))]
    assert all(s.num_prompt_tokens == 2 for s in steps)
