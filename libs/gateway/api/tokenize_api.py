"""vLLM's /tokenize and /detokenize extensions over the tokenizer service."""

from __future__ import annotations

from typing import Any

import grpc.aio

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.api.openai_api import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from libs.gateway.api.requests import chat_prompt, tokenizer_call
from libs.gateway.common import errors


async def tokenize(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, body: TokenizeRequest, *, model: str, max_model_len: int
) -> dict[str, Any]:
    """Messages are rendered with the chat template, as a chat completion's prompt would be."""
    if body.messages is not None:
        chat = ChatCompletionRequest(model=model, messages=body.messages)
        ids = await tokenizer_call(chat_prompt(tokenizer, chat))
        return {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}
    if body.prompt is None:
        raise errors.invalid("either prompt or messages is required", "prompt")
    request = tokenizer_pb2.TokenizeRequest(
        text=body.prompt, add_special_tokens=body.add_special_tokens, return_token_strs=body.return_token_strs
    )
    result = await tokenizer_call(tokenizer.Tokenize(request))
    reply: dict[str, Any] = {
        "tokens": list(result.token_ids),
        "count": len(result.token_ids),
        "max_model_len": max_model_len,
    }
    if body.return_token_strs:
        reply["token_strs"] = list(result.token_strs)
    return reply


async def detokenize(tokenizer: tokenizer_pb2_grpc.TokenizerStub, body: DetokenizeRequest) -> dict[str, Any]:
    try:
        result = await tokenizer.Detokenize(tokenizer_pb2.DetokenizeRequest(token_ids=body.tokens))
    except grpc.aio.AioRpcError as error:
        raise errors.invalid(error.details() or "invalid tokens", "tokens") from error
    return {"prompt": result.text}
