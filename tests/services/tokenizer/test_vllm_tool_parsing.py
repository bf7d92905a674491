"""vLLM's own tool parsers behind --tool-call-parser: a Hermes-format answer gives its calls
and the text around them; an unknown name is refused with vLLM's list."""

from __future__ import annotations

import json

import pytest

from libs.tokenization import Tokenizer
from libs.tokenization.vllm_tool_parsing import VllmToolCallParser

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


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
