"""ParseToolCalls without gRPC: the parser's calls as the response; no parser is the
deployment's fault, tools the parser cannot read the caller's."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.tokenizer import Tokenizer
from libs.tokenization.tool_call_requests import parse_tool_calls

TOKENIZER = cast(Tokenizer, SimpleNamespace(hf_tokenizer="the thread's own"))


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
    def __init__(self, error: ValueError | None = None) -> None:
        self.error = error
        self.seen: list[tuple[str, str, Any]] = []

    def parse(self, text: str, tools_json: str, hf_tokenizer: Any) -> Parsed:
        self.seen.append((text, tools_json, hf_tokenizer))
        if self.error is not None:
            raise self.error
        return Parsed(True, (Call("call_1", "weather", '{"city": "Oslo"}'),), "thinking")


def test_the_parsers_calls_are_the_answer() -> None:
    parser = FakeParser()
    request = pb.ParseToolCallsRequest(text="<tool_call>...", tools_json="[]")
    response = parse_tool_calls(TOKENIZER, request, parser)
    assert response.tools_called and response.content == "thinking"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1", "weather", '{"city": "Oslo"}')
    ]
    assert parser.seen == [("<tool_call>...", "[]", "the thread's own")]


def test_without_a_parser_it_is_a_failed_precondition() -> None:
    with pytest.raises(FailedPrecondition, match="no --tool-call-parser"):
        parse_tool_calls(TOKENIZER, pb.ParseToolCallsRequest(text="x"), None)


def test_tools_the_parser_cannot_read_are_invalid() -> None:
    parser = FakeParser(ValueError("not a list"))
    with pytest.raises(InvalidRequest, match="tools: not a list"):
        parse_tool_calls(TOKENIZER, pb.ParseToolCallsRequest(text="x", tools_json="{}"), parser)
