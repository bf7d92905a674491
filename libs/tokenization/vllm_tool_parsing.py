"""`tool_choice: auto`: tool calls found in a generated text by one of vLLM's tool parsers
(`--tool-call-parser NAME`, as vLLM's server takes it).

Why here, in the tokenizer service: a parser is model specific and built on the tokenizer
(it looks up its special tokens and vocabulary), which this service holds; the gateway holds
only text and the engines never detokenize. The gateway sends the finished text
(Tokenizer.ParseToolCalls) and builds the OpenAI response from the calls. vLLM is imported only
when a parser is configured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedToolCalls:
    tools_called: bool
    calls: tuple[ParsedCall, ...]
    content: str


class VllmToolCallParser:
    def __init__(self, name: str) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            self._parser_class = ToolParserManager.get_tool_parser(name)
        except KeyError:
            known = ", ".join(ToolParserManager.list_registered())
            raise ValueError(f"unknown --tool-call-parser {name!r}; vLLM's parsers: {known}") from None
        self.name = name

    def parse(self, text: str, tools_json: str, hf_tokenizer: Any) -> ParsedToolCalls:
        """`hf_tokenizer`: the calling thread's own (libs/tokenization/offload.py)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = json.loads(tools_json) if tools_json else None
        request = ChatCompletionRequest.model_validate(
            {"messages": [], "tools": tools, "tool_choice": "auto" if tools else "none"}
        )
        # A parser keeps state per response (vLLM makes one per request too).
        parser = self._parser_class(hf_tokenizer, list(request.tools) if request.tools else None)
        info = parser.extract_tool_calls(text, request)
        calls = tuple(ParsedCall(c.id or "", c.function.name, c.function.arguments) for c in info.tool_calls)
        return ParsedToolCalls(bool(info.tools_called), calls, info.content or "")
