"""vLLM's extension parameters of the completions and chat APIs, mapped onto the contract:
sampling extensions (the engine's), prompt options (the tokenizer's) and prompt truncation.

What the engine applies goes into SamplingParams; what the tokenizer service does (template
kwargs, message fields, special tokens, bad words' tokenization) into its requests. The
detokenizer's options (stop strings kept, special tokens skipped) travel in GenerationSpec.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.api.openai_api import ChatCompletionRequest, ChatMessageIn, _SamplingFields
from libs.gateway.common import errors


def apply_sampling_extensions(params: common_pb2.SamplingParams, body: _SamplingFields) -> None:
    """vLLM's sampling extensions the engine applies (bad words: see bad_words_token_ids)."""
    params.min_tokens = body.min_tokens
    params.skip_special_tokens = body.skip_special_tokens
    params.stop_token_ids.extend(body.stop_token_ids or [])
    params.allowed_token_ids.extend(body.allowed_token_ids or [])
    if body.allowed_token_ids == []:
        # vLLM refuses an empty list (nothing could be sampled).
        raise errors.invalid("allowed_token_ids is not allowed to be empty.", "allowed_token_ids")
    if body.vllm_xargs:
        params.extra_args_json = json.dumps(body.vllm_xargs)
    prompt_logprobs = body.prompt_logprobs
    echo_logprobs = _echo_logprobs(body)
    if prompt_logprobs is None and echo_logprobs is not None:
        # vLLM's rule: echo asks for the prompt's logprobs at the request's logprobs count.
        prompt_logprobs = echo_logprobs
    if prompt_logprobs is not None:
        params.prompt_logprobs = prompt_logprobs


def _echo_logprobs(body: _SamplingFields) -> int | None:
    if not getattr(body, "echo", False):
        return None
    if isinstance(body, ChatCompletionRequest):
        return body.top_logprobs or 0 if body.logprobs else None
    logprobs = getattr(body, "logprobs", None)
    return logprobs if isinstance(logprobs, int) and not isinstance(logprobs, bool) else None


async def bad_words_token_ids(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, words: Sequence[str]
) -> list[common_pb2.TokenIds]:
    """vLLM's SamplingParams.update_from_tokenizer, through the tokenizer service: each word
    without and with a leading space (a word at the start of the text and inside it), the
    second kept only when it is a different first token of the same length."""
    found: list[list[int]] = []
    for word in words:
        for prefix in ("", " "):
            response = await tokenizer.Tokenize(
                tokenizer_pb2.TokenizeRequest(text=prefix + word.lstrip(), add_special_tokens=False)
            )
            ids = list(response.token_ids)
            if not ids:
                if not prefix:
                    raise errors.invalid(
                        "bad_words entries must tokenize to at least one token.", "bad_words"
                    )
                continue
            if not prefix or (ids[0] != found[-1][0] and len(ids) == len(found[-1])):
                found.append(ids)
    return [common_pb2.TokenIds(ids=ids) for ids in found]


def set_render_options(request: tokenizer_pb2.RenderChatRequest, body: ChatCompletionRequest) -> None:
    """vLLM's chat options for the template: generation prompt or a continued final
    message, template kwargs, special tokens."""
    request.add_generation_prompt = body.add_generation_prompt
    request.continue_final_message = body.continue_final_message
    request.add_special_tokens = body.add_special_tokens
    try:
        kwargs = body.template_kwargs()
    except ValueError as error:
        raise errors.invalid(str(error), "chat_template_kwargs") from None
    if kwargs:
        request.chat_template_kwargs_json = json.dumps(kwargs)


def message_extra_json(message: ChatMessageIn) -> str:
    """The message's fields other than role and content, for the template ('' if none)."""
    extra = dict(message.model_extra or {})
    if message.name is not None:
        extra["name"] = message.name
    return json.dumps(extra) if extra else ""


def truncated(prompt: list[int], body: _SamplingFields, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: the last k tokens (-1: the context's length)."""
    keep = body.truncate_prompt_tokens
    if keep is None:
        return prompt
    if keep == -1:
        keep = max_model_len
    if keep > max_model_len:
        raise errors.invalid(
            f"truncate_prompt_tokens value ({keep}) is greater than max_model_len ({max_model_len}). "
            "Please request a smaller truncation size.",
            "truncate_prompt_tokens",
        )
    return prompt[-keep:] if keep else []
