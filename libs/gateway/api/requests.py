"""OpenAI request bodies -> token ids and the contract's SamplingParams."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.api.extensions import apply_sampling_extensions, message_extra_json, set_render_options
from libs.gateway.api.openai_api import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    TextPart,
    _SamplingFields,
)
from libs.gateway.api.structured import request_constraint
from libs.gateway.api.tools import add_tool_fields, tools_json
from libs.gateway.api.validation_errors import validation_failed
from libs.gateway.api.vllm_fields import check_refused
from libs.gateway.common import errors

T = TypeVar("T")


def check_supported(body: _SamplingFields) -> None:
    for feature, param in body.unsupported_fields():
        raise errors.unsupported(feature, param)
    if body.use_beam_search and body.stream:
        raise errors.invalid("Streaming is not currently supported with beam search", "stream")  # vLLM's
    check_refused(body.model_extra)


def sampling_params(
    body: _SamplingFields, *, max_tokens: int | None, logprobs: int | None
) -> common_pb2.SamplingParams:
    params = common_pb2.SamplingParams(
        n=body.n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        ignore_eos=body.ignore_eos,
        skip_special_tokens=True,
    )
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if body.temperature is not None:
        params.temperature = body.temperature
    if body.top_p is not None:
        params.top_p = body.top_p
    if body.top_k is not None:
        params.top_k = body.top_k
    if body.min_p is not None:
        params.min_p = body.min_p
    if body.seed is not None:
        params.seed = body.seed
    if body.repetition_penalty is not None:
        params.repetition_penalty = body.repetition_penalty
    if logprobs is not None:
        params.logprobs = logprobs
    structured = request_constraint(body)
    if structured is not None:
        params.structured_output.CopyFrom(structured)
    for token, bias in (body.logit_bias or {}).items():
        try:
            params.logit_bias[int(token)] = bias
        except ValueError:
            raise errors.invalid(f"logit_bias keys must be token ids, got {token!r}", "logit_bias") from None
    apply_sampling_extensions(params, body)
    return params


async def chat_prompt(tokenizer: tokenizer_pb2_grpc.TokenizerStub, body: ChatCompletionRequest) -> list[int]:
    return list((await chat_render(tokenizer, body)).token_ids)


async def chat_render(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, body: ChatCompletionRequest
) -> tokenizer_pb2.RenderChatResponse:
    """The conversation rendered by the model's template: its text and token ids."""
    request = tokenizer_pb2.RenderChatRequest()
    set_render_options(request, body)
    for message in body.messages:
        role = "system" if message.role == "developer" else message.role
        added = request.messages.add(role=role, content=_content_parts(message))
        add_tool_fields(added, message)
        added.extra_json = message_extra_json(message)
    request.tools_json = tools_json(body.tools)
    return await tokenizer.RenderChat(request)


def _content_parts(message: ChatMessageIn) -> list[tokenizer_pb2.ContentPart]:
    """One text part per message; a message with images keeps its parts in order, each image
    an (empty) placeholder the template renders: the encoder has the image itself."""
    if not message.image_urls() or not isinstance(message.content, list):
        return [tokenizer_pb2.ContentPart(text=message.text())]
    return [
        tokenizer_pb2.ContentPart(text=part.text)
        if isinstance(part, TextPart)
        else tokenizer_pb2.ContentPart(image=b"")
        for part in message.content
    ]


async def completion_prompts(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, body: CompletionRequest
) -> list[list[int]]:
    """The prompt(s) as token ids: text is tokenized; token ids pass through."""
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise errors.invalid("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [[int(p) for p in prompt]]  # type: ignore[arg-type]
    ids = []
    for item in prompt:
        if isinstance(item, list):
            ids.append([int(t) for t in item])
            continue
        if item == "":
            raise errors.invalid("prompt must not be empty", "prompt")
        response = await tokenizer.Tokenize(
            tokenizer_pb2.TokenizeRequest(text=str(item), add_special_tokens=body.add_special_tokens)
        )
        ids.append(list(response.token_ids))
    return ids


async def tokenizer_call(call: Awaitable[T]) -> T:
    """Awaits a tokenizer RPC; its failures become the API's errors (bad input: 400, else 503)."""
    try:
        return await call
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise errors.invalid(error.details() or "invalid input") from error
        raise errors.ApiError(
            503, f"tokenizer unavailable: {error.code().name}", type_="service_unavailable"
        ) from error


def validation_error(details: Sequence[Mapping[str, Any]]) -> errors.ApiError:
    """A body that failed validation -> vLLM's 400 for it (libs/gateway/api/validation_errors.py)."""
    return validation_failed(details)
