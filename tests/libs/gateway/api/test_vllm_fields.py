"""Every field of the installed vLLM's request models is implemented by Cleave's request
model or listed, with its reason, in libs/gateway/api/vllm_fields.py: a vLLM upgrade that adds a
field fails here until someone decides what Cleave does with it."""

from __future__ import annotations

import pytest
import structlog
from pydantic import BaseModel
from vllm.entrypoints.openai.chat_completion.protocol import BatchChatCompletionRequest as VllmBatch
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion

from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.api.requests import check_supported
from libs.gateway.api.vllm_fields import IGNORED, REFUSED, check_refused, warn_unknown
from libs.gateway.common import errors

PAIRS = [(VllmCompletion, CompletionRequest), (VllmChat, ChatCompletionRequest)]


@pytest.mark.parametrize(("vllm_model", "cleave_model"), PAIRS)
def test_every_vllm_field_is_implemented_or_listed(
    vllm_model: type[BaseModel], cleave_model: type[BaseModel]
) -> None:
    implemented = set(cleave_model.model_fields)
    listed = set(REFUSED) | set(IGNORED)
    missing = sorted(set(vllm_model.model_fields) - implemented - listed)
    assert not missing, f"vLLM fields neither implemented nor listed in vllm_fields.py: {missing}"


@pytest.mark.parametrize(("vllm_model", "cleave_model"), PAIRS)
def test_no_field_is_both_implemented_and_listed(
    vllm_model: type[BaseModel], cleave_model: type[BaseModel]
) -> None:
    # A field Cleave declares is read from the model, never from its extras: listing it too
    # would be a dead entry (refused or ignored in words, implemented in fact).
    both = sorted(set(cleave_model.model_fields) & (set(REFUSED) | set(IGNORED)))
    assert not both


def test_listed_fields_are_vllm_fields() -> None:
    # Stale entries (a field vLLM removed) are dropped from the table.
    known = set(VllmCompletion.model_fields) | set(VllmChat.model_fields) | set(VllmBatch.model_fields)
    assert sorted((set(REFUSED) | set(IGNORED)) - known) == []


def test_neutral_values_of_refused_fields_are_vllm_defaults() -> None:
    for name, refusal in REFUSED.items():
        for model in (VllmCompletion, VllmChat):
            field = model.model_fields.get(name)
            if field is not None and not field.is_required() and field.default_factory is None:
                assert field.default in refusal.neutral, (name, field.default)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_embeds": "AAAA"}, "prompt_embeds"),
        ({"watermarking": True}, "watermarking"),
        ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
        ({"logprob_token_ids": [1], "logprobs": 1}, "logprob_token_ids"),
    ],
)
def test_refused_fields_are_a_400_naming_the_field(body: dict[str, object], param: str) -> None:
    request = CompletionRequest.model_validate({"model": "m", "prompt": "hi", **body})
    with pytest.raises(errors.ApiError) as raised:
        check_supported(request)
    assert raised.value.status == 400 and raised.value.body()["error"]["param"] == param
    assert "not supported" in raised.value.body()["error"]["message"]


def test_neutral_values_of_refused_fields_pass() -> None:
    body = {
        "watermarking": False,
        "prompt_embeds": None,
        "kv_transfer_params": None,
    }
    check_supported(CompletionRequest.model_validate({"model": "m", "prompt": "hi", **body}))
    check_refused({"truncation_side": "left"})


def test_unknown_fields_are_accepted_and_logged_with_the_request_id() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi", "custom_field": 1}],
            "some_new_field": 1,
            "user": "u",
        }
    )
    check_supported(request)
    assert request.messages[0].model_extra == {"custom_field": 1}
    with structlog.testing.capture_logs() as logs:
        warn_unknown(request.model_extra, "req-1")
    assert logs == [
        {
            "fields": ["some_new_field"],
            "request_id": "req-1",
            "event": "request fields ignored (unknown)",
            "log_level": "warning",
        }
    ]
