"""Several prompts in one stream (libs/gateway/api/multi_prompt.py), as vLLM streams a prompt list."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from cleave.common.v1 import common_pb2
from libs.gateway.api.multi_prompt import merged
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from tests.libs.gateway.fakes import spec

pytestmark = pytest.mark.anyio


def specs(n: int) -> list[GenerationSpec]:
    return [
        dataclasses.replace(spec(n=n, request_id=f"r-{i}"), sampling=common_pb2.SamplingParams(n=n))
        for i in range(2)
    ]


async def two_tokens_each(spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
    prompt = int(spec.request_id[-1])
    for index in range(spec.sampling.n):
        for step in range(2):
            await asyncio.sleep(0)  # lets the prompts interleave
            yield SequenceEvent(index, f"p{prompt}s{index}t{step}", [step])
    yield Finished(
        prompt_tokens=3 + prompt, completion_tokens=2 * spec.sampling.n, cached_prompt_tokens=prompt
    )


async def test_choices_are_numbered_prompt_times_n_plus_index_and_usage_is_summed() -> None:
    events = [event async for event in merged(two_tokens_each, specs(n=2))(specs(2)[0])]
    *sequences, finished = events
    assert isinstance(finished, Finished)
    assert (finished.prompt_tokens, finished.completion_tokens, finished.cached_prompt_tokens) == (7, 8, 1)
    texts: dict[int, str] = {}
    for event in sequences:
        assert isinstance(event, SequenceEvent)
        texts[event.index] = texts.get(event.index, "") + event.text
    assert texts == {
        0: "p0s0t0p0s0t1",
        1: "p0s1t0p0s1t1",
        2: "p1s0t0p1s0t1",
        3: "p1s1t0p1s1t1",
    }


async def test_a_failing_prompt_ends_the_stream_and_cancels_the_other() -> None:
    cancelled = asyncio.Event()

    async def one_fails(spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        if spec.request_id.endswith("1"):
            raise RuntimeError("worker gone")
        try:
            yield SequenceEvent(0, "a", [1])
            await asyncio.Event().wait()  # would stream forever
        finally:
            cancelled.set()
        yield Finished(1, 1, 0)

    with pytest.raises(RuntimeError, match="worker gone"):
        async for _event in merged(one_fails, specs(n=1))(specs(1)[0]):
            pass
    assert cancelled.is_set()
