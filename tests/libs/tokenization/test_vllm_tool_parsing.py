"""vLLM's own tool parsers behind --tool-call-parser: a Hermes-format answer gives its calls
and the text around them; an unknown name is refused with vLLM's list."""

from __future__ import annotations

import json

import pytest

from libs.tokenization import Tokenizer
from libs.tokenization.vllm_tool_parsing import StreamingToolCalls, ToolCallsDelta, VllmToolCallParser

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}


def test_hermes_calls_and_content(smollm2: Tokenizer) -> None:
    text = 'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    parsed = VllmToolCallParser("hermes").parse(text, json.dumps([WEATHER]), smollm2.hf_tokenizer)
    assert parsed.tools_called
    [call] = parsed.calls
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Oslo"} and call.id
    assert parsed.content.strip() == "Let me look."


def test_text_without_calls(smollm2: Tokenizer) -> None:
    parsed = VllmToolCallParser("hermes").parse("Just sunny.", json.dumps([WEATHER]), smollm2.hf_tokenizer)
    assert not parsed.tools_called and parsed.calls == () and parsed.content == "Just sunny."


def test_an_unknown_parser_is_refused_with_vllms_names() -> None:
    with pytest.raises(ValueError, match=r"unknown --tool-call-parser 'nope'.*hermes"):
        VllmToolCallParser("nope")


def _feed_token_by_token(
    session: StreamingToolCalls, text: str, tokenizer: Tokenizer
) -> list[ToolCallsDelta]:
    """The text as an engine streams it: one token at a time, each token's own text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = []
    for i, token_id in enumerate(ids):
        piece = tokenizer.decode(ids[: i + 1])[len(tokenizer.decode(ids[:i])) :]
        deltas.append(session.feed(piece, [token_id], finished=i == len(ids) - 1))
    return deltas


def _arguments(deltas: list[ToolCallsDelta], index: int) -> list[str]:
    return [
        call.arguments for delta in deltas for call in delta.calls if call.index == index and call.arguments
    ]


def test_required_calls_stream_their_arguments_as_they_are_generated(smollm2: Tokenizer) -> None:
    text = (
        '[{"name": "weather", "parameters": {"city": "Oslo", "days": 3}}, {"name": "time", "parameters": {}}]'
    )
    session = StreamingToolCalls("required", json.dumps([WEATHER, TIME]), smollm2.hf_tokenizer, None)
    deltas = _feed_token_by_token(session, text, smollm2)
    firsts = [call for delta in deltas for call in delta.calls if call.id]
    assert [(call.index, call.name) for call in firsts] == [(0, "weather"), (1, "time")]
    assert all(call.id.startswith("chatcmpl-tool-") for call in firsts)
    # The arguments arrive over many deltas, and add up to the call's arguments.
    assert len(_arguments(deltas, 0)) > 3
    assert json.loads("".join(_arguments(deltas, 0))) == {"city": "Oslo", "days": 3}
    assert json.loads("".join(_arguments(deltas, 1))) == {}
    # A call is announced once its name is complete, before its arguments are.
    announced = next(i for i, delta in enumerate(deltas) if any(c.id for c in delta.calls))
    assert announced < len(deltas) // 2


def test_auto_streams_content_then_the_hermes_call_as_it_arrives(smollm2: Tokenizer) -> None:
    text = 'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    session = StreamingToolCalls(
        "auto", json.dumps([WEATHER]), smollm2.hf_tokenizer, VllmToolCallParser("hermes")
    )
    deltas = _feed_token_by_token(session, text, smollm2)
    content = "".join(delta.content or "" for delta in deltas)
    assert content.strip() == "Let me look."
    [first] = [call for delta in deltas for call in delta.calls if call.id]
    assert first.name == "weather"
    assert json.loads("".join(_arguments(deltas, 0))) == {"city": "Oslo"}
    assert len(_arguments(deltas, 0)) > 1


def test_auto_needs_a_parser_and_only_required_or_auto_stream(smollm2: Tokenizer) -> None:
    with pytest.raises(LookupError):
        StreamingToolCalls("auto", json.dumps([WEATHER]), smollm2.hf_tokenizer, None)
    with pytest.raises(ValueError, match="required"):
        StreamingToolCalls("none", json.dumps([WEATHER]), smollm2.hf_tokenizer, None)
