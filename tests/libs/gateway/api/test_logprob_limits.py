"""The workers' --max-logprobs at the gateway: vLLM's bound, messages and -1 (the vocabulary)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from libs.gateway.api.logprob_limits import apply_max_logprobs, engine_max_logprobs
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.common import errors

VOCAB = 49152


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "0", **fields})


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def refusal(body: CompletionRequest | ChatCompletionRequest, max_logprobs: int) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as raised:
        apply_max_logprobs(body, max_logprobs, VOCAB)
    return raised.value


def test_the_bound_is_vllms_default_unless_the_workers_say_and_minus_one_is_the_vocabulary() -> None:
    assert engine_max_logprobs(None, VOCAB) == 20
    assert engine_max_logprobs(5, VOCAB) == 5
    assert engine_max_logprobs(0, VOCAB) == 0
    assert engine_max_logprobs(-1, VOCAB) == VOCAB


@pytest.mark.parametrize("value", [21, 2**31, 2**70])
def test_sample_logprobs_above_the_bound_get_vllms_engine_refusal(value: int) -> None:
    # 2**31 came from the HTTP fuzzer: it does not fit the contract's int32 (was a 500).
    error = refusal(completion(logprobs=value), 20)
    assert error.status == 400
    assert error.body()["error"] == {
        "message": f"Requested sample logprobs of {value}, which is greater than max allowed: 20 "
        f"(parameter=logprobs, value={value})",
        "type": "BadRequestError",
        "param": "logprobs",
        "code": 400,
    }
    # Chat's top_logprobs is what the engine samples: the same check and parameter.
    assert refusal(chat(logprobs=True, top_logprobs=value), 20).param == "logprobs"


@pytest.mark.parametrize("value", [21, 2**31, 2**70])
def test_prompt_logprobs_above_the_bound_get_vllms_engine_refusal(value: int) -> None:
    error = refusal(completion(prompt_logprobs=value), 20)
    assert error.message == (
        f"Requested prompt logprobs of {value}, which is greater than max allowed: 20 "
        f"(parameter=prompt_logprobs, value={value})"
    )
    assert error.param == "prompt_logprobs"
    assert refusal(chat(prompt_logprobs=value), 20).param == "prompt_logprobs"


def test_counts_at_the_bound_pass_unchanged() -> None:
    body = completion(logprobs=20, prompt_logprobs=20, echo=True)
    apply_max_logprobs(body, 20, VOCAB)
    assert (body.logprobs, body.prompt_logprobs) == (20, 20)
    conversation = chat(logprobs=True, top_logprobs=20, prompt_logprobs=0)
    apply_max_logprobs(conversation, 20, VOCAB)
    assert (conversation.top_logprobs, conversation.prompt_logprobs) == (20, 0)


def test_minus_one_asks_for_the_whole_vocabulary_which_only_an_uncapped_engine_serves() -> None:
    message = f"Requested sample logprobs of {VOCAB}, which is greater than max allowed: 20"
    assert refusal(completion(logprobs=-1), 20).message.startswith(message)
    assert refusal(chat(logprobs=True, top_logprobs=-1), 20).message.startswith(message)
    assert refusal(completion(prompt_logprobs=-1), 20).message.startswith(
        f"Requested prompt logprobs of {VOCAB}, which"
    )
    # --max-logprobs -1: every count up to the vocabulary, -1 resolved for the contract.
    uncapped = engine_max_logprobs(-1, VOCAB)
    body = completion(logprobs=-1, prompt_logprobs=-1)
    apply_max_logprobs(body, uncapped, VOCAB)
    assert (body.logprobs, body.prompt_logprobs) == (VOCAB, VOCAB)
    conversation = chat(logprobs=True, top_logprobs=-1)
    apply_max_logprobs(conversation, uncapped, VOCAB)
    assert conversation.top_logprobs == VOCAB
    assert refusal(completion(logprobs=VOCAB + 1), uncapped).param == "logprobs"


def test_a_zero_bound_still_allows_the_sampled_tokens_own_logprob() -> None:
    # vLLM checks `if num_logprobs := logprobs`: 0 (the chosen token only) is never refused.
    body = completion(logprobs=0, prompt_logprobs=0)
    apply_max_logprobs(body, 0, VOCAB)
    assert refusal(completion(logprobs=1), 0).message.startswith("Requested sample logprobs of 1,")


def test_chat_top_logprobs_without_logprobs_are_not_sampled_so_not_bounded() -> None:
    body = chat(top_logprobs=0, prompt_logprobs=None)
    apply_max_logprobs(body, 0, VOCAB)
    assert body.top_logprobs == 0


@pytest.mark.parametrize(
    ("fields", "max_logprobs"),
    [
        ({"logprobs": 21}, 20),
        ({"prompt_logprobs": 21}, 20),
        ({"logprobs": -1}, 20),
        ({"prompt_logprobs": -1}, 7),
        ({"logprobs": 2, "prompt_logprobs": 3}, 1),
    ],
)
def test_the_messages_are_the_installed_vllms_engine_check(fields: dict[str, int], max_logprobs: int) -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    model_config = SimpleNamespace(max_logprobs=max_logprobs, get_vocab_size=lambda: VOCAB)
    with pytest.raises(VLLMValidationError) as raised:
        SamplingParams(**fields)._validate_logprobs(model_config)
    ours = refusal(completion(**fields), max_logprobs)
    assert ours.message == str(raised.value)
    assert ours.param == raised.value.parameter
