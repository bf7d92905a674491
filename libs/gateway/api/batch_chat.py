"""vLLM's batched chat completions (`POST /v1/chat/completions/batch`, its
OpenAIServingChatBatch): `messages` is a list of conversations, each answered as one chat
completion with the request's other fields; the response is one chat.completion whose choice i
answers conversation i, with the usage summed. As vLLM: no streaming, no tools, no beam
search, n = 1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from libs.gateway.api import request_ids
from libs.gateway.api.openai_api import ChatCompletionRequest
from libs.gateway.api.request_limits import RequestLimits
from libs.gateway.api.requests import validation_error
from libs.gateway.common import errors


def split(data: Any, limits: RequestLimits, max_model_len: int) -> tuple[str, list[ChatCompletionRequest]]:
    """The batch's request id and one chat request per conversation (request id `<id>_<i>`,
    as vLLM's sub-requests), or a 400 with vLLM's message.

    Each conversation is a sequence a worker generates, so the batch is held to the request's
    bounds before anything is validated, tokenized or queued: at most
    `--max-sequences-per-request` conversations, and all their message texts together at
    most the prompt character bound (as a completion's prompts together are)."""
    if not isinstance(data, dict):
        raise errors.invalid("the body must be a JSON object")
    base = request_ids.check(data.get("request_id")) or request_ids.random_id()
    conversations = data.get("messages")
    if not isinstance(conversations, list) or not conversations:
        raise errors.invalid("messages must be a non-empty list of conversations", "messages")
    limits.check_sequences(len(conversations), 1, "messages", what="conversation(s)")
    if any(not isinstance(c, list) or not c for c in conversations):
        raise errors.invalid("each conversation in messages must be a non-empty list of messages", "messages")
    if data.get("use_beam_search"):
        raise errors.invalid(
            "Batch chat completions do not support beam search. Please set `use_beam_search` to False.",
            "use_beam_search",
        )
    if data.get("n") not in (None, 1):
        raise errors.invalid("Batch chat completions do not support `n > 1`. Please set `n` to 1.", "n")
    if data.get("stream"):
        raise errors.invalid("Batch chat completions do not support streaming.", "stream")
    if data.get("tools") or data.get("tool_choice") not in (None, "none"):
        raise errors.invalid("Batch chat completions do not support tools.", "tools")
    shared = {k: v for k, v in data.items() if k not in ("messages", "request_id")}
    requests = []
    for i, conversation in enumerate(conversations):
        try:
            body = ChatCompletionRequest.model_validate({**shared, "messages": conversation})
        except ValidationError as error:
            raise validation_error(error.errors()) from None
        # Set after validation: `<id>_<i>` may pass the bound the client's id is held to.
        requests.append(body.model_copy(update={"request_id": f"{base}_{i}"}))
    limits.check_chars(
        sum(len(m.text()) for body in requests for m in body.messages), max_model_len, "messages"
    )
    return base, requests


def merge(request_id: str, bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The chat.completion objects of the conversations as one: choice i from conversation i,
    usage summed (cached prompt tokens too, when reported)."""
    merged = {key: value for key, value in bodies[0].items() if key not in ("choices", "usage")}
    merged["id"] = f"chatcmpl-{request_id}"
    merged["choices"] = [{**body["choices"][0], "index": i} for i, body in enumerate(bodies)]
    usage: dict[str, Any] = {
        key: sum(body["usage"][key] for body in bodies)
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    cached = sum(body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for body in bodies)
    if any("prompt_tokens_details" in body["usage"] for body in bodies):
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    merged["usage"] = usage
    # Per-conversation prompt fields have no single value for the batch (vLLM leaves them out).
    for key in ("prompt_logprobs", "prompt_token_ids", "prompt_text"):
        merged.pop(key, None)
    return merged
