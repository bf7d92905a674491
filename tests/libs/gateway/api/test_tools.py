"""Generated text -> tool calls: whole messages, streamed deltas, finish reasons (vLLM's rules),
and the tool fields of messages and requests sent to the tokenizer's template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.gateway.api.openai_api import ChatCompletionRequest
from libs.gateway.api.tool_stream import ToolCallsStream
from libs.gateway.api.tools import NamedFunction, NamedToolChoice, ToolCalling, tool_calling, tools_json
from libs.gateway.common import errors

pytestmark = pytest.mark.anyio

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


async def test_plain_text_without_tools() -> None:
    message, finish = await ToolCalling().message("hello", "stop")
    assert message == {"role": "assistant", "content": "hello"} and finish == "stop"


async def test_a_named_tools_text_is_its_arguments_and_finishes_with_stop() -> None:
    message, finish = await ToolCalling("named", "weather").message('{"city": "Oslo"}', "stop")
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert message["content"] == "" and finish == "stop"


async def test_required_parses_the_array_and_finishes_with_tool_calls() -> None:
    text = json.dumps(
        [{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "time", "parameters": {}}]
    )
    message, finish = await ToolCalling("required").message(text, "stop")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["weather", "time"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    assert finish == "tool_calls"
    # parallel_tool_calls=false keeps the first call (vLLM's maybe_filter_parallel_tool_calls).
    single, _ = await ToolCalling("required", parallel_tool_calls=False).message(text, "stop")
    assert len(single["tool_calls"]) == 1


async def test_required_cut_by_max_tokens_has_no_calls_and_keeps_length() -> None:
    message, finish = await ToolCalling("required").message('[{"name": "wea', "length")
    assert message["tool_calls"] == [] and message["content"] == '[{"name": "wea' and finish == "length"


async def test_auto_uses_the_tokenizers_parser() -> None:
    seen: list[str] = []

    async def parse(text: str) -> tokenizer_pb2.ParseToolCallsResponse:
        seen.append(text)
        return tokenizer_pb2.ParseToolCallsResponse(
            tools_called=True,
            tool_calls=[tokenizer_pb2.ToolCall(id="call_1", name="weather", arguments="{}")],
            content="Let me check.",
        )

    message, finish = await ToolCalling("auto", parse=parse).message("<tool_call>...", "stop")
    assert seen == ["<tool_call>..."]
    assert message["content"] == "Let me check." and message["tool_calls"][0]["id"] == "call_1"
    assert finish == "tool_calls"


async def test_auto_without_calls_is_plain_content() -> None:
    async def parse(text: str) -> tokenizer_pb2.ParseToolCallsResponse:
        return tokenizer_pb2.ParseToolCallsResponse(tools_called=False, content=text)

    message, finish = await ToolCalling("auto", parse=parse).message("just text", "stop")
    assert message["content"] == "just text" and message["tool_calls"] == [] and finish == "stop"


async def test_named_streams_arguments_with_id_and_name_first() -> None:
    stream = ToolCalling("named", "weather").stream()
    first, _ = await stream.delta(0, '{"ci', None)
    second, finish = await stream.delta(0, 'ty": "Oslo"}', "stop")
    call = first["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "weather", "arguments": '{"ci'}
    assert second == {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}
    assert finish == "stop"
    assert (await stream.delta(0, "", None))[0] == {}


async def test_required_streams_its_calls_when_the_sequence_ends() -> None:
    stream = ToolCalling("required").stream()
    assert await stream.delta(0, '[{"name": "weather", ', None) == ({}, None)
    delta, finish = await stream.delta(0, '"parameters": {"city": "Oslo"}}]', "stop")
    [call] = delta["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert finish == "tool_calls"


class FakeParseStream:
    """The tokenizer's ParseToolCallsStream, scripted: one response per delta it reads."""

    def __init__(self, responses: list[tokenizer_pb2.ParseToolCallsStreamResponse]) -> None:
        self.responses = list(responses)
        self.requests: list[tokenizer_pb2.ParseToolCallsStreamRequest] = []
        self.cancelled = False

    def ParseToolCallsStream(self, request_iterator: Any) -> FakeParseStream:
        self._requests = request_iterator
        return self

    async def read(self) -> tokenizer_pb2.ParseToolCallsStreamResponse:
        while True:  # the start message, then this read's delta
            request = await anext(self._requests)
            self.requests.append(request)
            if request.WhichOneof("kind") == "delta":
                return self.responses.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def part(index: int, arguments: str, id: str = "", name: str = "") -> tokenizer_pb2.ToolCallDelta:
    return tokenizer_pb2.ToolCallDelta(index=index, id=id, name=name, arguments=arguments)


def streamed(mode: str, fake: FakeParseStream, parallel: bool | None = True) -> Any:
    calling = ToolCalling(mode, parallel_tool_calls=parallel)  # type: ignore[arg-type]
    calling.open_stream = lambda choice: ToolCallsStream(fake, tool_choice=choice, tools_json="[]")  # type: ignore[arg-type]
    return calling.stream()


async def test_required_streams_argument_deltas_as_the_tokenizer_parses_them() -> None:
    Response = tokenizer_pb2.ParseToolCallsStreamResponse
    fake = FakeParseStream([
        Response(),
        Response(tool_calls=[part(0, '{"ci', id="chatcmpl-tool-1", name="weather")]),
        Response(tool_calls=[part(0, 'ty": "Oslo"}')]),
        Response(),
    ])  # fmt: skip
    stream = streamed("required", fake)
    tokens = ['[{"name": "wea', 'ther", "parameters": {"ci', 'ty": "Oslo"}', "}]"]
    deltas = [await stream.delta(0, t, "stop" if i == 3 else None, [i]) for i, t in enumerate(tokens)]
    assert deltas[0] == ({}, None)
    assert deltas[1] == (
        {"tool_calls": [{"index": 0, "id": "chatcmpl-tool-1", "type": "function",
                         "function": {"name": "weather", "arguments": '{"ci'}}]},
        None,
    )  # fmt: skip
    assert deltas[2] == ({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}, None)
    assert deltas[3] == ({}, "tool_calls")  # a call was streamed and the sequence stopped
    start = fake.requests[0].start
    assert (start.tool_choice, start.tools_json) == ("required", "[]")
    sent = [r.delta for r in fake.requests[1:]]
    assert [d.text for d in sent] == tokens and [list(d.token_ids) for d in sent] == [[0], [1], [2], [3]]
    assert [d.finished for d in sent] == [False, False, False, True]
    stream.close()
    assert not fake.cancelled  # the stream had ended: nothing to cancel


async def test_auto_streams_content_and_calls_and_one_call_when_parallel_calls_are_off() -> None:
    Response = tokenizer_pb2.ParseToolCallsStreamResponse
    fake = FakeParseStream([
        Response(content="Let me look."),
        Response(tool_calls=[part(0, "{}", id="a", name="x"), part(1, "{}", id="b", name="y")]),
    ])  # fmt: skip
    stream = streamed("auto", fake, parallel=False)
    assert await stream.delta(0, "Let me look.", None, [1]) == ({"content": "Let me look."}, None)
    delta, finish = await stream.delta(0, "<tool_call>...", "length", [2])
    assert [c["id"] for c in delta["tool_calls"]] == ["a"]  # vLLM's maybe_filter_parallel_tool_calls
    assert finish == "length"  # only a sequence that stopped on its own finishes with tool_calls


async def test_a_stream_left_early_cancels_its_tokenizer_calls() -> None:
    fake = FakeParseStream([tokenizer_pb2.ParseToolCallsStreamResponse()])
    stream = streamed("required", fake)
    await stream.delta(0, "[", None, [1])
    stream.close()
    assert fake.cancelled


async def test_plain_stream_deltas_are_content() -> None:
    stream = ToolCalling().stream()
    assert await stream.delta(0, "hi", None) == ({"content": "hi"}, None)
    assert await stream.delta(0, "", "stop") == ({}, "stop")


def body(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    )


def test_auto_needs_the_flag_with_vllms_message() -> None:
    with pytest.raises(errors.ApiError, match='"auto" tool choice requires --enable-auto-tool-choice'):
        tool_calling(body(tools=[WEATHER]), tokenizer=None, auto_enabled=False)  # type: ignore[arg-type]
    assert tool_calling(body(tools=[WEATHER]), tokenizer=None, auto_enabled=True).mode == "auto"  # type: ignore[arg-type]
    forced = body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    calling = tool_calling(forced, tokenizer=None, auto_enabled=False)  # type: ignore[arg-type]
    assert (calling.mode, calling.function_name) == ("named", "weather")
    assert isinstance(forced.tool_choice, NamedToolChoice) and forced.tool_choice.function == NamedFunction(
        name="weather"
    )


def test_tools_go_to_the_template_as_json() -> None:
    assert json.loads(tools_json(body(tools=[WEATHER]).tools)) == [WEATHER]
    assert tools_json(None) == ""


def test_follow_up_messages_keep_their_tool_fields() -> None:
    follow_up = body(
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    )
    assistant, tool = follow_up.messages[1], follow_up.messages[2]
    assert assistant.tool_calls is not None and assistant.tool_calls[0].function.name == "weather"
    assert tool.tool_call_id == "c1" and tool.text() == "sunny"
