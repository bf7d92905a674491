"""RenderChat: a chat request (messages, template options, tools) -> the prompt text and its
token ids, rendered and tokenized as vLLM's chat path does, so that a prompt gives the engine
the same ids on either stack. The tokenizer service runs it on a pool thread (offload.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.chat import ChatMessage
from libs.tokenization.tokenizer import Tokenizer
from libs.tokenization.tools import message_tool_fields, tool_dicts


def render_chat(
    tokenizer: Tokenizer, request: tokenizer_pb2.RenderChatRequest, *, model: str
) -> tokenizer_pb2.RenderChatResponse:
    """`model`: the served name, for the refusal when the model has no chat template."""
    if not tokenizer.has_chat_template:
        # The server's setup, not the request, is at fault; say what still works.
        raise FailedPrecondition(
            f"model {model!r} has no chat template; send a plain prompt (Tokenize) instead"
        )
    if request.continue_final_message and request.add_generation_prompt:
        raise InvalidRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    messages = chat_messages(request.messages)
    kwargs = json_object(request.chat_template_kwargs_json, where="chat_template_kwargs")
    try:
        tools = tool_dicts(request.tools_json)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None
    if tools is not None:
        # As vLLM passes them: apply_chat_template(tools=...), which the template renders.
        kwargs = {**kwargs, "tools": tools}
    try:
        prompt = tokenizer.render_chat(
            messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            template_kwargs=kwargs,
        )
    except ValueError as error:  # bad roles/content, or the template's raise_exception()
        raise InvalidRequest(str(error)) from error
    # The rendered text already holds the template's special tokens (bos included where
    # the template writes it): adding them again would double bos. vLLM's chat path
    # tokenizes with add_special_tokens=False too, so the engine sees the same ids.
    # `add_special_tokens` (vLLM's chat option, off by default) adds them anyway.
    token_ids = tokenizer.encode(prompt, add_special_tokens=request.add_special_tokens)
    num_images = sum(part.WhichOneof("part") == "image" for m in request.messages for part in m.content)
    return tokenizer_pb2.RenderChatResponse(prompt=prompt, token_ids=token_ids, num_images=num_images)


def chat_messages(messages: Sequence[tokenizer_pb2.ChatMessage]) -> list[ChatMessage]:
    """Content parts -> one text per message; roles are checked by chat.py."""
    converted: list[ChatMessage] = []
    for index, message in enumerate(messages):
        texts: list[str] = []
        parts: list[dict[str, str]] = []
        for part_index, part in enumerate(message.content):
            kind = part.WhichOneof("part")
            where = f"messages[{index}].content[{part_index}]"
            if kind is None:
                raise InvalidRequest(f"{where} is empty; set text")
            if kind == "image":
                parts.append({"type": "image"})
            else:
                texts.append(part.text)
                parts.append({"type": "text", "text": part.text})
        # vLLM joins a message's text parts with newlines before templating; do the same so
        # a prompt renders to the same ids on either stack. A message with images goes to
        # the template as its parts, in order (vLLM's "openai" content format: the template
        # writes each image's placeholder, which the engine expands). `name` is dropped:
        # ChatML templates (SmolLM2's included) do not render it.
        content: str | list[dict[str, str]] = parts if len(parts) > len(texts) else "\n".join(texts)
        converted.append(
            ChatMessage(
                role=message.role,
                content=content,
                extra={
                    **json_object(message.extra_json, where=f"messages[{index}]"),
                    **_tool_fields(message, index),
                },
            )
        )
    return converted


def _tool_fields(message: tokenizer_pb2.ChatMessage, index: int) -> dict[str, Any]:
    try:
        return message_tool_fields(message.tool_calls, message.tool_call_id)
    except ValueError as error:
        raise InvalidRequest(f"messages[{index}]: {error}") from None


def json_object(text: str, *, where: str) -> dict[str, Any]:
    """An optional JSON object field of a request ({} when empty)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequest(f"{where}: not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: expected a JSON object")
    return value
