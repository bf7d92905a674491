"""Per-request bounds checked before any service works on a request: 400s naming the field."""

from __future__ import annotations

import pytest

from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from libs.gateway.api.request_limits import CHARS_PER_CONTEXT_TOKEN, RequestLimits
from libs.gateway.common import errors


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})


def chat(content: str, **fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    )


def refused(limits: RequestLimits, body: CompletionRequest | ChatCompletionRequest) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as raised:
        limits.check(body, max_model_len=8)
    assert raised.value.status == 400
    return raised.value


def test_prompt_characters_default_to_a_multiple_of_the_context() -> None:
    limits = RequestLimits()
    at_limit = "a" * (CHARS_PER_CONTEXT_TOKEN * 8)
    limits.check(completion(prompt=at_limit), max_model_len=8)
    limits.check(chat(at_limit), max_model_len=8)
    assert refused(limits, completion(prompt=[at_limit, "b"])).param == "prompt"
    assert refused(limits, chat(at_limit + "b")).param == "messages"
    assert refused(RequestLimits(max_prompt_chars=3), completion(prompt="abcd")).param == "prompt"
    with pytest.raises(errors.ApiError):
        limits.check_tokenize(TokenizeRequest(prompt=at_limit + "b"), max_model_len=8)


def test_stop_strings_are_bounded_in_number_and_length() -> None:
    limits = RequestLimits(max_stop_strings=2, max_stop_string_chars=3)
    limits.check(completion(stop=["abc", "d"]), max_model_len=8)
    assert refused(limits, completion(stop=["a", "b", "c"])).param == "stop"
    error = refused(limits, completion(stop="abcd"))
    assert error.param == "stop" and "at most 3 characters" in error.message


def test_prompts_times_n_is_bounded() -> None:
    limits = RequestLimits(max_sequences=4)
    limits.check(completion(prompt=["a", "b"], n=2), max_model_len=8)
    limits.check(completion(prompt=[1, 2, 3], n=4), max_model_len=8)  # one prompt of token ids
    error = refused(limits, completion(prompt=["a", "b", "c"], n=2))
    assert error.param == "n" and "6 sequences" in error.message
    assert refused(limits, chat("x", n=5)).param == "n"
