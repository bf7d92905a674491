"""/tokenize and /detokenize over a fake tokenizer."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
import pytest

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.gateway.api import tokenize_api
from libs.gateway.api.openai_api import DetokenizeRequest, TokenizeRequest
from libs.gateway.common import errors
from tests.libs.gateway.fakes import FakeTokenizer

pytestmark = pytest.mark.anyio


async def tokenize(**fields: Any) -> dict[str, Any]:
    fake: Any = FakeTokenizer()
    return await tokenize_api.tokenize(fake, TokenizeRequest(**fields), model="m", max_model_len=100)


async def test_a_prompt_is_tokenized_with_its_token_strings_when_asked() -> None:
    assert await tokenize(prompt="Hello| world") == {"tokens": [1, 3], "count": 2, "max_model_len": 100}
    assert (await tokenize(prompt="Hello| world", return_token_strs=True))["token_strs"] == [
        "Hello",
        " world",
    ]


async def test_messages_are_rendered_like_a_chat_prompt() -> None:
    reply = await tokenize(messages=[{"role": "system", "content": "ab"}, {"role": "user", "content": "abc"}])
    assert reply == {"tokens": [2, 3], "count": 2, "max_model_len": 100}


async def test_tokenize_needs_a_prompt_or_messages() -> None:
    with pytest.raises(errors.ApiError, match="either prompt or messages") as raised:
        await tokenize()
    assert raised.value.status == 400


class RefusingTokenizer:
    async def Detokenize(self, request: tokenizer_pb2.DetokenizeRequest) -> tokenizer_pb2.DetokenizeResponse:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="id 99 out of range",
        )


async def test_detokenize_gives_the_text_or_a_400_for_unknown_ids() -> None:
    fake: Any = FakeTokenizer()
    assert await tokenize_api.detokenize(fake, DetokenizeRequest(tokens=[1, 2, 3])) == {
        "prompt": "Hello, world"
    }
    refusing: Any = RefusingTokenizer()
    with pytest.raises(errors.ApiError, match="id 99 out of range") as raised:
        await tokenize_api.detokenize(refusing, DetokenizeRequest(tokens=[99]))
    assert (raised.value.status, raised.value.param) == (400, "tokens")
