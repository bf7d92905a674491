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


@dataclass(frozen=True)
class CallDelta:
    """One call's part of a streamed delta (OpenAI's `delta.tool_calls[]`)."""

    index: int
    id: str  # the call's first delta only
    name: str  # the call's first delta only
    arguments: str


@dataclass(frozen=True)
class ToolCallsDelta:
    content: str | None
    calls: tuple[CallDelta, ...]


class StreamingToolCalls:
    """One streamed sequence's tool calls, parsed as its text arrives, by vLLM's own code, as
    vLLM's serving_chat streams them (its Parser._extract_tool_calls_streaming):
    `required` by vLLM's partial-array scanner (extract_required_tool_call_streaming, no model
    knowledge, so without a parser too), `auto` by the parser's extract_tool_calls_streaming,
    with the arguments the parser held back appended to the last delta (finalize_generation)."""

    def __init__(
        self, tool_choice: str, tools_json: str, hf_tokenizer: Any, parser: VllmToolCallParser | None
    ) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        if tool_choice not in ("required", "auto"):
            raise ValueError(f"tool_choice must be 'required' or 'auto', got {tool_choice!r}")
        tools = json.loads(tools_json) if tools_json else None
        self._request = ChatCompletionRequest.model_validate(
            {"messages": [], "tools": tools, "tool_choice": tool_choice}
        )
        self._tool_parser: Any = None
        if tool_choice == "auto":
            if parser is None:
                raise LookupError("no --tool-call-parser")
            # A parser keeps state per response (vLLM makes one per choice).
            self._tool_parser = parser._parser_class(
                hf_tokenizer, list(self._request.tools) if self._request.tools else None
            )
        self._text = ""
        self._token_ids: list[int] = []

    def feed(self, delta_text: str, delta_token_ids: list[int], finished: bool) -> ToolCallsDelta:
        previous_text, previous_ids = self._text, self._token_ids
        current_text = previous_text + delta_text
        current_ids = previous_ids + delta_token_ids
        if self._tool_parser is None:
            from vllm.tool_parsers.streaming import extract_required_tool_call_streaming

            message, _ = extract_required_tool_call_streaming(
                previous_text=previous_text,
                current_text=current_text,
                tool_call_idx=None,
                tool_call_id_type="random",
            )
        else:
            message = self._tool_parser.extract_tool_calls_streaming(
                previous_text, current_text, delta_text, previous_ids, current_ids, delta_token_ids,
                self._request,
            )  # fmt: skip
            if finished and message is not None and message.tool_calls and message.tool_calls[-1].function:
                last = message.tool_calls[-1].function
                last.arguments = (last.arguments or "") + self._tool_parser.get_remaining_unstreamed_args()
        self._text, self._token_ids = current_text, current_ids
        if message is None:
            return ToolCallsDelta(None, ())
        calls = tuple(
            CallDelta(
                index=call.index,
                id=call.id or "",
                name=(call.function.name or "") if call.function else "",
                arguments=(call.function.arguments or "") if call.function else "",
            )
            for call in message.tool_calls or []
        )
        return ToolCallsDelta(message.content, calls)
