"""A validated request + its prompt's token ids -> the GenerationSpec the pipeline runs."""

from __future__ import annotations

import uuid

from cleave.common.v1 import common_pb2
from libs.gateway.api.extensions import truncated
from libs.gateway.api.openai_api import _SamplingFields
from libs.gateway.api.requests import sampling_params
from libs.gateway.common import errors, metrics
from libs.gateway.common.generation import GenerationSpec


def generation_spec(
    body: _SamplingFields,
    prompt: list[int],
    *,
    model: str,
    max_model_len: int,
    max_tokens: int | None,
    logprobs: int | None,
    max_tokens_cap: int | None = None,
    default_max_tokens: int | None = None,
    prompt_tokens_details: bool = False,
    request_id: str | None = None,
    lora: common_pb2.LoraAdapter | None = None,
) -> GenerationSpec:
    """Refuses prompts that are empty or, with the completion, longer than the context.

    With no max_tokens the completion may use the rest of the context (as vLLM does), so no
    request generates without bound. `max_tokens_cap` (the server's) lowers any larger
    value, asked for or not, as vLLM's override of max_new_tokens does.
    `default_max_tokens` (the model's max_new_tokens under `--generation-config auto`)
    bounds a request that sets none, as in vLLM's get_max_tokens.
    `prompt_tokens_details`: report cached prompt tokens in usage (vLLM's
    --enable-prompt-tokens-details). `request_id`: the client's (vLLM's `request_id`), else a
    fresh one. The prompt is first cut to `truncate_prompt_tokens`, as vLLM does.
    """
    prompt = truncated(prompt, body, max_model_len)
    if not prompt:
        raise errors.invalid("prompt is empty", "prompt")
    if max_tokens is None:
        max_tokens = max(1, max_model_len - len(prompt))
        if default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
    if max_tokens_cap is not None:
        max_tokens = min(max_tokens, max_tokens_cap)
    if len(prompt) + max_tokens > max_model_len:
        raise errors.context_too_long(len(prompt), max_tokens, max_model_len)
    metrics.PROMPT_TOKENS.observe(len(prompt))
    return GenerationSpec(
        request_id=request_id or uuid.uuid4().hex,
        model=model,
        prompt_token_ids=prompt,
        sampling=sampling_params(body, max_tokens=max_tokens, logprobs=logprobs),
        stops=body.stops(),
        cache_salt=body.cache_salt or "",
        prompt_tokens_details=prompt_tokens_details,
        include_stop_str_in_output=body.include_stop_str_in_output,
        lora=lora,
    )
