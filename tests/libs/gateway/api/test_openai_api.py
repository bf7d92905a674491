from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from libs.gateway.api.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from libs.gateway.api.requests import check_supported, sampling_params
from libs.gateway.common.errors import ApiError


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_text_parts_and_max_completion_tokens() -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         "max_tokens": 5, "max_completion_tokens": 7}
    )  # fmt: skip
    assert body.messages[0].text() == "ab"
    assert body.requested_max_tokens() == 7


@pytest.mark.parametrize(
    "fields",
    [{"max_tokens": -1}, {"temperature": 3}, {"n": 0}, {"top_p": 0}, {"messages": []}],
)
def test_invalid_bodies_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        chat(**fields)


def test_unsupported_features_are_refused_not_ignored() -> None:
    # Tools and response_format are implemented (tests/libs/gateway/test_tools.py,
    # test_structured.py); vLLM's fields Cleave refuses: test_vllm_fields.py.
    check_supported(chat(use_beam_search=True, n=2))  # libs/gateway/api/beam_search.py
    with pytest.raises(ApiError, match="Streaming is not currently supported with beam search"):
        check_supported(chat(use_beam_search=True, stream=True))
    check_supported(chat(response_format={"type": "text"}))
    with pytest.raises(ApiError, match="best_of > 1"):
        check_supported(CompletionRequest(model="m", prompt="x", best_of=2))


def test_sampling_mapping() -> None:
    params = sampling_params(
        chat(temperature=0, seed=5, n=2, stop="x", logit_bias={"7": -1.0}), max_tokens=9, logprobs=2
    )
    assert params.HasField("temperature") and params.temperature == 0
    assert (params.seed, params.n, params.max_tokens, params.logprobs) == (5, 2, 9, 2)
    assert dict(params.logit_bias) == {7: -1.0}
    with pytest.raises(ApiError, match="logit_bias keys must be token ids"):
        sampling_params(chat(logit_bias={"x": 1.0}), max_tokens=1, logprobs=None)


# A JSON "\ud800" escape decodes to a lone surrogate, which protobuf cannot encode: found by
# tests/e2e/test_fuzz_http.py as a 500 from the first gRPC call; refused at the edge now.
@pytest.mark.parametrize(
    ("model", "body"),
    [
        (CompletionRequest, {"model": "m", "prompt": "fox \ud800"}),
        (CompletionRequest, {"model": "m", "prompt": ["ok", "\udfff"]}),
        (CompletionRequest, {"model": "m", "prompt": "fox", "stop": ["\ud83d"]}),
        (CompletionRequest, {"model": "m", "prompt": "fox", "logit_bias": {"\ud800": 1}}),
        (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "\udfff"}]}),
        (
            ChatCompletionRequest,
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        ),
        (TokenizeRequest, {"prompt": "\udc00"}),
    ],
)
def test_lone_surrogates_are_refused(model: type[CompletionRequest], body: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="lone surrogate"):
        model.model_validate(body)


def test_deeply_nested_bodies_are_refused_without_recursion() -> None:
    nested: object = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": nested})


@pytest.mark.parametrize("token_id", [-1, 2**31, 2**40])
def test_detokenize_ids_fit_the_contract(token_id: int) -> None:
    with pytest.raises(ValidationError):
        DetokenizeRequest.model_validate({"tokens": [5, token_id]})
    assert DetokenizeRequest.model_validate({"tokens": [0, 2**31 - 1]}).tokens == [0, 2**31 - 1]


def test_tokenize_messages_may_not_be_empty() -> None:
    # Found by tests/e2e/test_fuzz_http.py: `{"messages": []}` reached ChatCompletionRequest
    # inside the handler and failed there as a 500.
    with pytest.raises(ValidationError, match="messages"):
        TokenizeRequest.model_validate({"messages": []})
    assert TokenizeRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}).messages


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_stream_options_need_stream_as_in_vllm(
    model: type[CompletionRequest] | type[ChatCompletionRequest],
) -> None:
    prompt = (
        {"prompt": "hi"} if model is CompletionRequest else {"messages": [{"role": "user", "content": "hi"}]}
    )
    body = {"model": "m", **prompt, "stream_options": {"include_usage": True}}
    with pytest.raises(ValidationError, match="only be defined when `stream=True`") as raised:
        model.model_validate(body)
    assert raised.value.errors()[0]["loc"] == ("stream_options",)
    options = model.model_validate({**body, "stream": True}).stream_options
    assert options is not None and options.include_usage
    model.model_validate({**body, "stream_options": {}})  # an empty object is accepted, as by vLLM


def test_unknown_fields_are_accepted_as_by_vllm() -> None:
    # vLLM's OpenAIBaseModel: extra fields pass (the gateway logs and ignores them).
    body = chat(unknown_field=1)
    assert body.model_extra == {"unknown_field": 1}


def test_image_parts_are_parsed_in_order() -> None:
    # Whether an encoder serves them is the gateway's check (libs/gateway/api/images.py).
    first = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    second = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB", "detail": "low"}}
    body = chat(
        messages=[{"role": "user", "content": [first, {"type": "text", "text": "what is this?"}, second]}]
    )
    assert body.messages[0].image_urls() == ["data:image/png;base64,AAAA", "data:image/png;base64,BBBB"]
    assert body.messages[0].text() == "what is this?"


def test_audio_parts_get_one_clear_refusal() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(ValidationError) as raised:
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what is this?"}, audio]}])
    errors = raised.value.errors()
    assert len(errors) == 1 and errors[0]["loc"] == ("messages", 0, "content")
    assert "'input_audio' are not supported" in errors[0]["msg"]


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprob_counts_are_minus_one_or_more_as_vllm_checks_them(field: str) -> None:
    # The upper bound is the workers' --max-logprobs (test_logprob_limits.py).
    for value in (-1, 0, 21, 2**70):
        assert (
            getattr(CompletionRequest.model_validate({"model": "m", "prompt": "0", field: value}), field)
            == value
        )
    with pytest.raises(ValidationError, match=rf"`{field}` must be a positive value or -1\."):
        CompletionRequest.model_validate({"model": "m", "prompt": "0", field: -2})
    with pytest.raises(ValidationError, match=r"`top_logprobs` must be a positive value or -1\."):
        chat(logprobs=True, top_logprobs=-2)
    assert chat(logprobs=True, top_logprobs=-1).top_logprobs == -1


def test_min_tokens_stays_within_what_the_contract_carries() -> None:
    with pytest.raises(ValidationError, match="min_tokens"):
        CompletionRequest.model_validate({"model": "m", "prompt": "0", "min_tokens": 2**31})


@pytest.mark.parametrize(
    "fields", [{}, {"prompt": None}, {"prompt": ""}, {"prompt": None, "prompt_embeds": []}]
)
def test_a_completion_without_a_prompt_gets_vllms_message(fields: dict[str, object]) -> None:
    # vLLM's CompletionRequest.validate_prompt_and_prompt_embeds (its tests match the text).
    message = re.escape("Either prompt or prompt_embeds must be provided and non-empty.")
    with pytest.raises(ValidationError, match=message):
        CompletionRequest.model_validate({"model": "m", **fields})
