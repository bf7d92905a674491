"""Tool calling at the edge: request types, the forced-tool schema, and generated text ->
`tool_calls` (whole messages and streamed deltas), as vLLM's OpenAI server does it.

- `tool_choice` named or `required`: the engines generate under a JSON Schema built from the
  tools (vLLM's get_json_schema_from_tools), so the text *is* the call: a named tool's
  arguments, or `required`'s array of {"name", "parameters"}. Parsing it needs no model
  knowledge, so it runs here on the text. vLLM 0.32 refuses both unless `--tool-call-parser` is
  set (it reuses the parser's generic JSON path); Cleave serves them with any model.
- `auto`: model-specific formats need vLLM's tool parsers, which need the tokenizer (special
  tokens, vocabulary), so they run in the tokenizer service (`ParseToolCalls`, started with
  `--tool-call-parser`); the gateway sends the finished text.
- Streams: a named tool's arguments stream as generated; `required` and `auto` are parsed as
  the text arrives by vLLM's streaming parsers in the tokenizer service
  (`ParseToolCallsStream`, libs/gateway/api/tool_stream.py), so arguments stream as OpenAI
  tool-call deltas while they are generated, as vLLM's serving_chat streams them.
- `none`: the tools are still rendered into the prompt (as vLLM does unless told otherwise).

finish_reason: "tool_calls" for `required` and for `auto` when the parser found calls; "stop"
for a named tool (OpenAI's and vLLM's rule).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import grpc.aio
from pydantic import BaseModel

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.api.tool_stream import ToolCallsStream
from libs.gateway.common import errors

# The tokenizer service's ParseToolCalls (bound to the stub and request id), for `auto`.
ParseCalls = Callable[[str], Awaitable[tokenizer_pb2.ParseToolCallsResponse]]
# Opens the tokenizer service's ParseToolCallsStream for one sequence ("required" or "auto").
OpenStream = Callable[[str], ToolCallsStream]


class FunctionDefinition(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def tool_calling(
    body: Any, tokenizer: tokenizer_pb2_grpc.TokenizerStub, *, auto_enabled: bool
) -> ToolCalling:
    """A chat request's tool handling; `auto` needs --enable-auto-tool-choice (vLLM's rule and
    message: tools without a tool_choice mean `auto`)."""
    if body.tools and body.tool_choice == "auto" and not auto_enabled:
        raise errors.invalid(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "tool_choice",
        )
    text_tools = tools_json(body.tools)

    async def parse(text: str) -> tokenizer_pb2.ParseToolCallsResponse:
        request = tokenizer_pb2.ParseToolCallsRequest(text=text, tools_json=text_tools)
        try:
            return await tokenizer.ParseToolCalls(request)
        except grpc.aio.AioRpcError as error:
            raise errors.ApiError(
                503,
                f"tool-call parsing failed: {error.details() or error.code().name}",
                type_="service_unavailable",
            ) from error

    def open_stream(tool_choice: str) -> ToolCallsStream:
        return ToolCallsStream(tokenizer, tool_choice=tool_choice, tools_json=text_tools)

    calling = ToolCalling.for_request(body.tools, body.tool_choice, body.parallel_tool_calls, parse)
    if calling.mode in ("required", "auto"):
        calling.open_stream = open_stream
    return calling


def tool_call_id() -> str:
    # vLLM's make_tool_call_id ("random" kind).
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tools_json(tools: list[ToolParam] | None) -> str:
    """The tools as the chat template reads them (RenderChatRequest.tools_json)."""
    if not tools:
        return ""
    return json.dumps([tool.model_dump(exclude_none=True) for tool in tools])


def add_tool_fields(message: tokenizer_pb2.ChatMessage, source: Any) -> None:
    """An assistant message's tool calls and a tool message's call id, for the template."""
    for call in getattr(source, "tool_calls", None) or []:
        message.tool_calls.add(id=call.id, name=call.function.name, arguments=call.function.arguments)
    if getattr(source, "tool_call_id", None):
        message.tool_call_id = source.tool_call_id


def forced_schema(
    tools: list[ToolParam] | None, choice: ToolChoice | None, parallel_tool_calls: bool | None
) -> dict[str, Any] | None:
    """vLLM's get_json_schema_from_tools for chat completions: a named tool's parameters, or for
    `required` an array of {"name", "parameters"} objects, one of the tools each."""
    if not tools or choice in (None, "none", "auto"):
        return None
    if isinstance(choice, NamedToolChoice):
        for tool in tools:
            if tool.function.name == choice.function.name:
                return _params_or_empty_object(tool.function.parameters)
        raise ValueError(f"Tool '{choice.function.name}' has not been passed in `tools`.")
    definitions: dict[str, Any] = {}
    alternatives = []
    for tool in tools:
        params = copy.deepcopy(tool.function.parameters)
        if params is not None:
            for name, definition in (params.pop("$defs", None) or {}).items():
                if name in definitions and definitions[name] != definition:
                    raise ValueError(
                        f"Tool definition '{name}' has multiple schemas, which is not supported."
                    )
                definitions[name] = definition
        alternatives.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": _params_or_empty_object(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": alternatives},
    }
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema


def _params_or_empty_object(params: dict[str, Any] | None) -> dict[str, Any]:
    return params if params else {"type": "object", "properties": {}}


@dataclass
class ToolCalling:
    """One chat request's tool handling; `mode` is None when the text is plain content."""

    mode: Literal["named", "required", "auto"] | None = None
    function_name: str = ""
    parallel_tool_calls: bool | None = None
    parse: ParseCalls | None = None
    open_stream: OpenStream | None = None  # streams of `required` and `auto`

    @classmethod
    def for_request(
        cls,
        tools: list[ToolParam] | None,
        choice: ToolChoice | None,
        parallel_tool_calls: bool | None,
        parse: ParseCalls | None,
    ) -> ToolCalling:
        if not tools or choice in (None, "none"):
            return cls()
        if isinstance(choice, NamedToolChoice):
            return cls("named", choice.function.name, parallel_tool_calls)
        if choice == "required":
            return cls("required", parallel_tool_calls=parallel_tool_calls)
        return cls("auto", parallel_tool_calls=parallel_tool_calls, parse=parse)

    async def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The assistant message for a whole generated text, and the choice's finish_reason."""
        if self.mode is None:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = await self._calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": calls}
        return message, self._finish_reason(calls, finish_reason)

    def _finish_reason(self, calls: list[dict[str, Any]], finish_reason: str | None) -> str | None:
        if self.mode == "required" and finish_reason == "stop":
            return "tool_calls"
        if self.mode == "auto" and calls:
            return "tool_calls"
        return finish_reason

    async def _calls(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        calls: list[dict[str, Any]]
        content: str | None = None
        if self.mode == "named":
            calls = [_call(self.function_name, text)] if text.strip() else []
            content = "" if calls else text
        elif self.mode == "required":
            calls = [_call(item["name"], json.dumps(item.get("parameters"), ensure_ascii=False))
                     for item in _json_array(text)]  # fmt: skip
            content = "" if calls else text
        else:
            if self.parse is None:
                return text, []
            parsed = await self.parse(text)
            calls = (
                [_call(c.name, c.arguments, c.id or None) for c in parsed.tool_calls]
                if parsed.tools_called
                else []
            )
            content = (parsed.content or None) if calls else text
            if content is not None and calls and not content.strip():
                content = None
        if self.parallel_tool_calls is False:
            calls = calls[:1]  # vLLM's maybe_filter_parallel_tool_calls
        return content, calls

    def stream(self) -> ToolStream:
        return ToolStream(self)


def _call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _json_array(text: str) -> list[dict[str, Any]]:
    # As vLLM: text that is not the grammar's array (a sequence cut by max_tokens) has no calls.
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict) and isinstance(item.get("name"), str)]


@dataclass
class ToolStream:
    """Streamed deltas of one request's choices. A named tool's arguments stream as generated
    (the first delta carries the call's id and name, as vLLM's extract_named_tool_call_streaming);
    `required` and `auto` stream through the tokenizer service's parsers (`open_stream`), or,
    without one, hold their text back and send the calls when the sequence ends."""

    calling: ToolCalling
    _held: dict[int, list[str]] = field(default_factory=dict)
    _named_ids: dict[int, str] = field(default_factory=dict)
    _streams: dict[int, ToolCallsStream] = field(default_factory=dict)
    _streamed_calls: set[int] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return self.calling.mode is not None

    async def delta(
        self, index: int, text: str, finish_reason: str | None, token_ids: list[int] | None = None
    ) -> tuple[dict[str, Any], str | None]:
        """The delta for one event of sequence `index`, and the finish_reason to send."""
        calling = self.calling
        if calling.mode is None:
            return ({"content": text} if text else {}), finish_reason
        if calling.mode == "named":
            if not text:
                return {}, finish_reason
            call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if index not in self._named_ids:
                self._named_ids[index] = tool_call_id()
                call = {"index": 0, "id": self._named_ids[index], "type": "function",
                        "function": {"name": calling.function_name, "arguments": text}}  # fmt: skip
            return {"tool_calls": [call]}, finish_reason
        if calling.open_stream is not None:
            return await self._parsed_delta(index, text, token_ids or [], finish_reason)
        self._held.setdefault(index, []).append(text)
        if finish_reason is None:
            return {}, None
        content, calls = await calling._calls("".join(self._held.pop(index)))
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return delta, calling._finish_reason(calls, finish_reason)

    async def _parsed_delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> tuple[dict[str, Any], str | None]:
        stream = self._streams.get(index)
        if stream is None:
            assert self.calling.open_stream is not None and self.calling.mode is not None
            stream = self._streams[index] = self.calling.open_stream(self.calling.mode)
        parsed = await stream.feed(text, token_ids, finished=finish_reason is not None)
        delta: dict[str, Any] = {}
        if parsed.HasField("content") and parsed.content:
            delta["content"] = parsed.content
        calls = []
        for part in parsed.tool_calls:
            if self.calling.parallel_tool_calls is False and part.index > 0:
                continue  # vLLM's maybe_filter_parallel_tool_calls
            function: dict[str, Any] = {"arguments": part.arguments}
            entry: dict[str, Any] = {"index": part.index, "function": function}
            if part.id:
                entry.update(id=part.id, type="function")
            if part.name:
                function["name"] = part.name
            calls.append(entry)
        if calls:
            delta["tool_calls"] = calls
            self._streamed_calls.add(index)
        # vLLM's rule: "tool_calls" once a sequence streamed a call and stopped on its own.
        if finish_reason == "stop" and index in self._streamed_calls:
            finish_reason = "tool_calls"
        return delta, finish_reason

    def close(self) -> None:
        """Ends the tokenizer streams still open (a client that left, a failed stream)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
