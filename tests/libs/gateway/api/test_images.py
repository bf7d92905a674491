"""The gateway's image step: URLs in message order to the encoder, its answers mapped to
the API's errors (a bad image: 400 with the encoder's message; an encoder down: 503); without
an encoder, the files read from the URLs with the encoder's limits (bad ones: 400)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import grpc
import grpc.aio
import pytest

from cleave.common.v1 import common_pb2
from cleave.encoder.v1 import encoder_pb2
from libs.encoder.images import ImageLimits, content_hash
from libs.gateway.api.images import (
    TEXT_ONLY,
    encode_images,
    image_cache_salt,
    image_files,
    image_files_salt,
    image_urls,
)
from libs.gateway.api.openai_api import ChatCompletionRequest
from libs.gateway.common import errors


def body(*messages: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(messages)})


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


CONVERSATION = body(
    {"role": "user", "content": [image("data:a"), {"type": "text", "text": "and"}, image("data:b")]},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": [image("data:c")]},
)


class FakeEncoder:
    def __init__(self, error: grpc.StatusCode | None = None) -> None:
        self.error = error
        self.requests: list[encoder_pb2.EncodeRequest] = []

    async def Encode(self, request: encoder_pb2.EncodeRequest, **kwargs: Any) -> encoder_pb2.EncodeResponse:
        self.requests.append(request)
        if self.error is not None:
            raise grpc.aio.AioRpcError(
                self.error, grpc.aio.Metadata(), grpc.aio.Metadata(), "image 1: the data is not an image"
            )
        return encoder_pb2.EncodeResponse(
            embeddings=[
                encoder_pb2.ImageEmbedding(embeddings=common_pb2.Tensor(shape=[i + 1, 2]), cached=i == 0)
                for i, _ in enumerate(request.images)
            ]
        )


def test_urls_in_conversation_order() -> None:
    assert image_urls(CONVERSATION) == ["data:a", "data:b", "data:c"]
    assert image_urls(body({"role": "user", "content": "text only"})) == []


def test_embeddings_in_order() -> None:
    encoder = FakeEncoder()
    tensors = asyncio.run(encode_images(encoder, CONVERSATION, "r1"))
    assert [list(t.shape) for t in tensors] == [[1, 2], [2, 2], [3, 2]]
    (request,) = encoder.requests
    assert [i.url for i in request.images] == ["data:a", "data:b", "data:c"]
    assert request.metadata.request_id == "r1"


def test_text_only_request_never_calls_the_encoder() -> None:
    assert asyncio.run(encode_images(None, body({"role": "user", "content": "hi"}), "r")) == []


@pytest.mark.parametrize(
    ("encoder", "status", "needle"),
    [
        (None, 400, TEXT_ONLY),
        (FakeEncoder(grpc.StatusCode.INVALID_ARGUMENT), 400, "image 1: the data is not an image"),
        (FakeEncoder(grpc.StatusCode.UNAVAILABLE), 503, "encoder unavailable: UNAVAILABLE"),
    ],
)
def test_errors(encoder: FakeEncoder | None, status: int, needle: str) -> None:
    with pytest.raises(errors.ApiError) as raised:
        asyncio.run(encode_images(encoder, CONVERSATION, "r"))
    assert raised.value.status == status and needle in str(raised.value.message)


def test_cache_salt_carries_the_images() -> None:
    a, b = encoder_pb2.ImageEmbedding(content_hash="aa"), encoder_pb2.ImageEmbedding(content_hash="bb")
    assert image_cache_salt("", [a]) != image_cache_salt("", [b])
    assert image_cache_salt("", [a, b]) != image_cache_salt("", [b, a])
    assert image_cache_salt("client", [a]).startswith("client|images:")
    assert image_cache_salt("", [a]) == image_cache_salt("", [a])


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_without_an_encoder_the_files_in_order() -> None:
    conversation = body(
        {"role": "user", "content": [image(data_url(b"one")), image(data_url(b"two"))]},
        {"role": "user", "content": [image(data_url(b"three"))]},
    )
    assert asyncio.run(image_files(conversation, ImageLimits())) == [b"one", b"two", b"three"]
    assert asyncio.run(image_files(body({"role": "user", "content": "hi"}), ImageLimits())) == []


@pytest.mark.parametrize(
    ("url", "limits", "needle"),
    [
        ("http://127.0.0.1:9/cat.png", ImageLimits(), "disabled on this server"),
        ("data:image/png;base64,%%%", ImageLimits(), "base64 data is invalid"),
        (data_url(b"x" * 64), ImageLimits(max_bytes=16), "larger than this server's limit of 16 bytes"),
    ],
)
def test_without_an_encoder_unreadable_urls_are_400s(url: str, limits: ImageLimits, needle: str) -> None:
    with pytest.raises(errors.ApiError) as raised:
        asyncio.run(image_files(body({"role": "user", "content": [image(url)]}), limits))
    assert raised.value.status == 400 and needle in str(raised.value.message)


def test_files_salt_is_the_encoders_salt_of_the_same_images() -> None:
    embedding = encoder_pb2.ImageEmbedding(content_hash=content_hash(b"one"))
    assert image_files_salt("c", [b"one"]) == image_cache_salt("c", [embedding])
    assert image_files_salt("", [b"one"]) != image_files_salt("", [b"two"])
