"""Tools in the tokenizer service: a tool-aware template renders the request's tools, an
assistant message's tool calls (arguments as dicts, as vLLM gives them to templates) and a
tool message's call id; ParseToolCalls answers with the configured parser's calls, and without
one is FAILED_PRECONDITION (the deployment's setup, not the client's mistake)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.tokenization import Tokenizer
from services.tokenizer.servicer import TokenizerServicer, binding

pytestmark = pytest.mark.anyio

# What tool-calling templates (Hermes/Qwen style) do with these fields (transformers renders
# with trim_blocks: no newline after a block tag).
TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.id }} {{ c.function.name }}"
    "({{ c.function.arguments.city }}){% endfor %}{% endif %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{{ m.content }}\n{% endfor %}"
)
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Parsed:
    tools_called: bool
    calls: tuple[Call, ...]
    content: str


class FakeParser:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def parse(self, text: str, tools_json: str, hf_tokenizer: Any) -> Parsed:
        self.seen.append((text, tools_json, hf_tokenizer))
        return Parsed(True, (Call("call_1", "weather", '{"city": "Oslo"}'),), "thinking")


async def serve(servicer: TokenizerServicer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    server = GrpcServer(ServerConfig(shutdown_grace_s=1.0), [binding(servicer)])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            yield tokenizer_pb2_grpc.TokenizerStub(channel)
    finally:
        await server.stop()


@pytest.fixture
async def parser() -> FakeParser:
    return FakeParser()


@pytest.fixture
async def stub(smollm2: Tokenizer, parser: FakeParser) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    tool_aware = Tokenizer(
        smollm2.hf_tokenizer, eos_token_ids=smollm2.eos_token_ids, chat_template=TEMPLATE, source="t"
    )
    async for stub in serve(TokenizerServicer(tool_aware, model="m", max_model_len=64, tool_parser=parser)):
        yield stub


async def test_tools_and_tool_messages_reach_the_template(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    messages = [
        pb.ChatMessage(role="user", content=[pb.ContentPart(text="Weather?")]),
        pb.ChatMessage(
            role="assistant", tool_calls=[pb.ToolCall(id="c1", name="weather", arguments='{"city": "Oslo"}')]
        ),
        pb.ChatMessage(role="tool", tool_call_id="c1", content=[pb.ContentPart(text="sunny")]),
    ]
    response = await stub.RenderChat(
        pb.RenderChatRequest(messages=messages, tools_json=json.dumps([WEATHER]))
    )
    assert (
        response.prompt == "TOOLS:weather;<user>Weather?\n<assistant>CALL c1 weather(Oslo)\n<tool>[c1]sunny\n"
    )


async def test_bad_tool_call_arguments_are_invalid(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    bad = pb.ChatMessage(
        role="assistant", tool_calls=[pb.ToolCall(id="c1", name="weather", arguments="{nope")]
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.RenderChat(pb.RenderChatRequest(messages=[bad]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0]" in (raised.value.details() or "")


async def test_parse_tool_calls_answers_with_the_parsers_calls(
    stub: tokenizer_pb2_grpc.TokenizerStub, parser: FakeParser
) -> None:
    tools = json.dumps([WEATHER])
    response = await stub.ParseToolCalls(pb.ParseToolCallsRequest(text="<tool_call>...", tools_json=tools))
    assert response.tools_called and response.content == "thinking"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1", "weather", '{"city": "Oslo"}')
    ]
    text, tools_json, hf_tokenizer = parser.seen[0]
    assert (text, tools_json) == ("<tool_call>...", tools) and hf_tokenizer is not None


async def test_without_a_parser_parse_tool_calls_is_a_failed_precondition(smollm2: Tokenizer) -> None:
    async for stub in serve(TokenizerServicer(smollm2, model="m", max_model_len=64)):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ParseToolCalls(pb.ParseToolCallsRequest(text="x"))
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def _start(tool_choice: str) -> pb.ParseToolCallsStreamRequest:
    start = pb.ParseToolCallsStreamRequest.Start(tools_json=json.dumps([WEATHER]), tool_choice=tool_choice)
    return pb.ParseToolCallsStreamRequest(start=start)


def _delta(text: str, finished: bool = False) -> pb.ParseToolCallsStreamRequest:
    return pb.ParseToolCallsStreamRequest(
        delta=pb.ParseToolCallsStreamRequest.Delta(text=text, finished=finished)
    )


async def test_parse_tool_calls_stream_answers_each_delta_of_a_required_array(smollm2: Tokenizer) -> None:
    pieces = ['[{"name": "wea', 'ther", "parameters": {"ci', 'ty": "Os', 'lo"}}]']
    async for stub in serve(TokenizerServicer(smollm2, model="m", max_model_len=64)):
        requests = [_start("required")] + [_delta(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
        responses = [r async for r in stub.ParseToolCallsStream(iter(requests))]
    assert len(responses) == len(pieces)  # one per delta, then the stream ends
    assert not responses[0].tool_calls  # the name is not complete yet
    [first] = responses[1].tool_calls
    assert (first.index, first.name) == (0, "weather") and first.id
    assert first.arguments == '{"ci'
    assert [c.arguments for r in responses[2:] for c in r.tool_calls] == ['ty": "Os', 'lo"}']
    assert not any(c.id or c.name for r in responses[2:] for c in r.tool_calls)


async def test_parse_tool_calls_stream_refuses_what_it_cannot_serve(smollm2: Tokenizer) -> None:
    async for stub in serve(TokenizerServicer(smollm2, model="m", max_model_len=64)):
        for requests, code in (
            # Refused on the first message, before any response.
            ([_start("auto")], grpc.StatusCode.FAILED_PRECONDITION),  # no parser
            ([_delta("x")], grpc.StatusCode.INVALID_ARGUMENT),  # no start
            ([_start("none")], grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                _ = [r async for r in stub.ParseToolCallsStream(iter(requests))]
            assert raised.value.code() == code, raised.value.details()
