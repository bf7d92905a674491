"""Tool definitions and tool-call messages in the form chat templates read them, as vLLM's chat
utils hand them to transformers' apply_chat_template: `tools` as a list of dicts, an assistant
message's `tool_calls` with their arguments parsed to dicts (templates index into them), a
`tool` message's `tool_call_id`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol


class ParsedCallLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str: ...


class ParsedToolCallsLike(Protocol):
    @property
    def tools_called(self) -> bool: ...
    @property
    def calls(self) -> Sequence[ParsedCallLike]: ...
    @property
    def content(self) -> str: ...


class ToolCallParser(Protocol):
    """vllm_tool_parsing.VllmToolCallParser, as the tokenizer service uses it."""

    def parse(self, text: str, tools_json: str, hf_tokenizer: Any) -> ParsedToolCallsLike: ...


class ToolCallLike(Protocol):
    id: str
    name: str
    arguments: str


def tool_dicts(tools_json: str) -> list[dict[str, Any]] | None:
    """The request's tools (RenderChatRequest.tools_json); None when it has none."""
    if not tools_json:
        return None
    try:
        tools = json.loads(tools_json)
    except ValueError as error:
        raise ValueError(f"tools: not valid JSON: {error}") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools: expected a list of objects")
    return tools


def message_tool_fields(tool_calls: Sequence[ToolCallLike], tool_call_id: str) -> dict[str, Any]:
    """A message's tool fields for the template ({} when it has none)."""
    fields: dict[str, Any] = {}
    if tool_calls:
        fields["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call)},
            }
            for call in tool_calls
        ]
    if tool_call_id:
        fields["tool_call_id"] = tool_call_id
    return fields


def _arguments(call: ToolCallLike) -> Any:
    # vLLM's _postprocess_messages: templates expect a dict; an empty string is no arguments.
    if not call.arguments:
        return {}
    try:
        return json.loads(call.arguments)
    except ValueError:
        raise ValueError(f"tool call {call.id!r}: arguments are not valid JSON") from None
