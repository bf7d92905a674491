"""Request body + prompt ids -> GenerationSpec: the limits the gateway enforces first."""

from __future__ import annotations

import pytest

from libs.gateway.api.openai_api import CompletionRequest
from libs.gateway.api.spec import generation_spec
from libs.gateway.common import errors


def body(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})


def test_the_spec_carries_the_prompt_sampling_and_stops() -> None:
    spec = generation_spec(
        body(temperature=0.5, n=2, stop=["\n", "."], seed=7),
        [1, 2, 3],
        model="m",
        max_model_len=64,
        max_tokens=10,
        logprobs=3,
    )
    assert spec.model == "m"
    assert spec.prompt_token_ids == [1, 2, 3]
    assert spec.stops == ["\n", "."]
    assert (spec.sampling.max_tokens, spec.sampling.n, spec.sampling.seed, spec.sampling.logprobs) == (
        10,
        2,
        7,
        3,
    )
    assert spec.sampling.temperature == 0.5
    assert len(spec.request_id) == 32 and int(spec.request_id, 16) >= 0


def test_each_spec_gets_its_own_request_id() -> None:
    ids = {
        generation_spec(body(), [1], model="m", max_model_len=8, max_tokens=1, logprobs=None).request_id
        for _ in range(3)
    }
    assert len(ids) == 3


def test_without_max_tokens_the_completion_may_fill_the_context() -> None:
    spec = generation_spec(body(), [1, 2, 3], model="m", max_model_len=10, max_tokens=None, logprobs=None)
    assert spec.sampling.max_tokens == 7
    assert not spec.sampling.HasField("logprobs")


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(errors.ApiError, match="prompt is empty") as raised:
        generation_spec(body(), [], model="m", max_model_len=10, max_tokens=1, logprobs=None)
    assert (raised.value.status, raised.value.param) == (400, "prompt")


def test_a_prompt_and_completion_longer_than_the_context_are_refused() -> None:
    with pytest.raises(errors.ApiError) as raised:
        generation_spec(body(), [1, 2, 3], model="m", max_model_len=10, max_tokens=8, logprobs=None)
    assert raised.value.status == 400
    assert raised.value.code == "context_length_exceeded"
    assert "you requested 11 tokens (3 in the prompt, 8 for the completion)" in raised.value.message
    # Exactly the context is fine.
    generation_spec(body(), [1, 2, 3], model="m", max_model_len=10, max_tokens=7, logprobs=None)


def test_the_servers_cap_lowers_any_larger_completion_length() -> None:
    def max_tokens(requested: int | None) -> int:
        spec = generation_spec(
            body(),
            [1, 2, 3],
            model="m",
            max_model_len=100,
            max_tokens=requested,
            logprobs=None,
            max_tokens_cap=20,
        )
        return spec.sampling.max_tokens

    assert (max_tokens(None), max_tokens(50), max_tokens(5)) == (20, 20, 5)


def test_the_cache_salt_and_prompt_tokens_details_reach_the_spec() -> None:
    salted = generation_spec(
        body(cache_salt="tenant-a"), [1], model="m", max_model_len=8, max_tokens=1, logprobs=None
    )
    assert (salted.cache_salt, salted.metadata().cache_salt, salted.prompt_tokens_details) == (
        "tenant-a",
        "tenant-a",
        False,
    )
    plain = generation_spec(
        body(), [1], model="m", max_model_len=8, max_tokens=1, logprobs=None, prompt_tokens_details=True
    )
    assert (plain.cache_salt, plain.prompt_tokens_details) == ("", True)


@pytest.mark.parametrize("salt", ["", "a/b", "a@b", "a\\b", "a\x00b", "x" * 129])
def test_cache_salts_vllm_refuses_are_refused(salt: str) -> None:
    with pytest.raises(ValueError, match="cache_salt"):
        body(cache_salt=salt)
    from libs.gateway.api.openai_api import ChatCompletionRequest

    with pytest.raises(ValueError, match="cache_salt"):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "cache_salt": salt}
        )


def test_the_models_generation_config_bounds_a_request_that_sets_no_max_tokens() -> None:
    # `--generation-config auto` with max_new_tokens=5 in generation_config.json: vLLM's
    # get_max_tokens takes the smaller of it and the room left in the context.
    def max_tokens(requested: int | None, max_model_len: int = 100) -> int:
        spec = generation_spec(
            body(),
            [1, 2, 3],
            model="m",
            max_model_len=max_model_len,
            max_tokens=requested,
            logprobs=None,
            default_max_tokens=5,
        )
        return spec.sampling.max_tokens

    assert max_tokens(None) == 5
    assert max_tokens(None, max_model_len=6) == 3  # the context leaves less room
    assert max_tokens(40) == 40  # a request's own value wins
