"""A body that fails validation gets the same 400 from Cleave's gateway as from vLLM's OpenAI
server: the gateway's mirror of vLLM's handler (libs/gateway/api/validation_errors.py) against
the installed vLLM's own handler, on the errors of real bodies."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler

from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.api.validation_errors import validation_failed

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def fastapi_errors(model: type[BaseModel], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The errors FastAPI's RequestValidationError carries for `body` (loc under 'body')."""
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    return [{**error, "loc": ("body", *error["loc"])} for error in raised.value.errors(include_url=False)]


def vllm_answer(details: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    request = SimpleNamespace(
        app=SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(log_error_stack=False))),
        state=SimpleNamespace(),
    )
    response = asyncio.run(validation_exception_handler(request, RequestValidationError(details)))
    return response.status_code, json.loads(response.body)


BODIES = [
    pytest.param(CompletionRequest, {**COMPLETION, "seed": 2**64}, id="seed above int64"),
    pytest.param(ChatCompletionRequest, {**CHAT, "seed": -(2**63) - 1}, id="seed below int64"),
    pytest.param(CompletionRequest, {**COMPLETION, "temperature": "hot"}, id="wrong type"),
    pytest.param(CompletionRequest, {"prompt": "hi"}, id="missing field"),
    pytest.param(ChatCompletionRequest, {**CHAT, "messages": "hello"}, id="messages not a list"),
    pytest.param(CompletionRequest, {**COMPLETION, "temperature": "x" * 500}, id="long input echoed"),
    pytest.param(
        CompletionRequest,
        {**COMPLETION, "stream_options": {"include_usage": True}},
        id="a validator's own error",
    ),
    pytest.param(
        CompletionRequest,
        {"model": 1, "prompt": 2, **{key: "x" for key in ("temperature", "top_p", "top_k", "min_p",
         "seed", "n", "presence_penalty", "frequency_penalty", "max_tokens", "logprobs", "echo")}},
        id="more than ten errors",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("model", "body"), BODIES)
def test_the_400_is_vllms(model: type, body: dict[str, Any]) -> None:
    details = fastapi_errors(model, body)
    error = validation_failed(details)
    assert (error.status, error.body()) == vllm_answer(details)


def test_the_message_names_pydantics_error_type() -> None:
    # What clients (and vLLM's test_long_seed) read: the kind of failure, not only prose.
    error = validation_failed(fastapi_errors(CompletionRequest, {**COMPLETION, "seed": 2**64}))
    assert error.message.startswith("1 validation error:\n")
    assert "'type': 'less_than_equal'" in error.message
    assert (error.param, error.type, error.code) == ("body.seed", "Bad Request", 400)


def test_pydantic_errors_of_a_validated_part_drop_their_documentation_url() -> None:
    # The batched chat endpoint validates each conversation itself: pydantic's own errors()
    # carry a url that FastAPI's do not; the answer must not depend on which produced it.
    with pytest.raises(ValidationError) as raised:
        CompletionRequest.model_validate({**COMPLETION, "seed": "x"})
    with_url = validation_failed(raised.value.errors())
    without = validation_failed(raised.value.errors(include_url=False))
    assert with_url.body() == without.body()
    assert "https://errors.pydantic.dev" not in with_url.message


def test_no_details_is_still_an_openai_error() -> None:
    error = validation_failed([])
    assert (error.status, error.message, error.param) == (400, "Validation error", None)
