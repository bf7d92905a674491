"""The ParseToolCallsStream protocol without gRPC: a `start` that cannot be served is refused
before any delta (no parser for `auto`: the deployment's fault; a bad tool_choice: the
caller's), each delta becomes one response with the calls' new parts, and the stream ends
after the delta marked finished."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.tokenizer import Tokenizer
from libs.tokenization.vllm_tool_call_stream import Delta, Request, Start, ToolCallStream, tool_call_stream

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def start(tool_choice: str) -> Start:
    return Start(tools_json=json.dumps([WEATHER]), tool_choice=tool_choice)


def test_each_delta_gets_one_response_with_the_calls_new_parts(smollm2: Tokenizer) -> None:
    stream = ToolCallStream(start("required"), smollm2.hf_tokenizer, None)
    pieces = ['[{"name": "wea', 'ther", "parameters": {"ci', 'ty": "Os', 'lo"}}]']
    responses = [stream.feed(Delta(text=p, finished=i == len(pieces) - 1)) for i, p in enumerate(pieces)]
    assert isinstance(responses[0], pb.ParseToolCallsStreamResponse) and not responses[0].tool_calls
    [first] = responses[1].tool_calls
    assert (first.index, first.name, first.arguments) == (0, "weather", '{"ci') and first.id
    assert [c.arguments for r in responses[2:] for c in r.tool_calls] == ['ty": "Os', 'lo"}']


def test_a_start_that_cannot_be_served_is_refused(smollm2: Tokenizer) -> None:
    with pytest.raises(FailedPrecondition, match="no --tool-call-parser"):
        ToolCallStream(start("auto"), smollm2.hf_tokenizer, None)
    with pytest.raises(InvalidRequest, match="tools: tool_choice must be 'required' or 'auto'"):
        ToolCallStream(start("none"), smollm2.hf_tokenizer, None)


@pytest.mark.anyio
async def test_the_stream_answers_each_delta_and_ends_at_the_finished_one(smollm2: Tokenizer) -> None:
    async def requests() -> AsyncIterator[Request]:
        yield Request(start=start("required"))
        yield Request(delta=Delta(text='[{"name": "weather", "parameters": {}}]', finished=True))
        yield Request(delta=Delta(text="never read"))

    responses = [r async for r in tool_call_stream(requests(), smollm2.hf_tokenizer, None)]
    assert [c.name for r in responses for c in r.tool_calls if c.name] == ["weather"]
    assert len(responses) == 1


@pytest.mark.anyio
async def test_the_stream_needs_a_start_then_deltas(smollm2: Tokenizer) -> None:
    async def no_start() -> AsyncIterator[Request]:
        yield Request(delta=Delta(text="x"))

    async def start_twice() -> AsyncIterator[Request]:
        yield Request(start=start("required"))
        yield Request(start=start("required"))

    with pytest.raises(InvalidRequest, match="the first message must be `start`"):
        _ = [r async for r in tool_call_stream(no_start(), smollm2.hf_tokenizer, None)]
    with pytest.raises(InvalidRequest, match="expected `delta`"):
        _ = [r async for r in tool_call_stream(start_twice(), smollm2.hf_tokenizer, None)]
