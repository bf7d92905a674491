"""The DetokenizeStream protocol without gRPC: no `start` is raised before any response (the
call's INVALID_ARGUMENT); a half-close means `finish`; a bad message once started is the
stream's typed error, its last response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import pytest

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from libs.rpc.errors import InvalidRequest
from libs.tokenization.detokenize_stream import detokenize_stream
from libs.tokenization.tokenizer import Tokenizer

pytestmark = pytest.mark.anyio

START = pb.DetokenizeStreamRequest(start=pb.DetokenizeStart())


async def messages(
    requests: Iterable[pb.DetokenizeStreamRequest],
) -> AsyncIterator[pb.DetokenizeStreamRequest]:
    for request in requests:
        yield request


async def run(
    tokenizer: Tokenizer, requests: list[pb.DetokenizeStreamRequest]
) -> list[pb.DetokenizeStreamResponse]:
    return [r async for r in detokenize_stream(tokenizer, messages(requests), service="tokenizer")]


def tokens(ids: list[int]) -> pb.DetokenizeStreamRequest:
    return pb.DetokenizeStreamRequest(tokens=pb.TokenBatch(token_ids=ids))


async def test_a_stream_without_start_is_refused_before_any_response(smollm2: Tokenizer) -> None:
    with pytest.raises(InvalidRequest, match="the first message must be `start`, got nothing"):
        await run(smollm2, [])
    with pytest.raises(InvalidRequest, match="got `tokens`"):
        await run(smollm2, [tokens([1])])


async def test_a_half_close_completes_the_text(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("Hello world", add_special_tokens=False)
    responses = await run(smollm2, [START, tokens(ids)])
    assert [r.WhichOneof("kind") for r in responses] == ["delta", "complete"]
    assert responses[0].delta.text + responses[1].complete.text == "Hello world"


async def test_a_bad_message_once_started_is_the_streams_typed_error(smollm2: Tokenizer) -> None:
    responses = await run(smollm2, [START, pb.DetokenizeStreamRequest(), tokens([1])])
    [error] = responses
    assert error.error.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT
    assert "got an empty message" in error.error.message
