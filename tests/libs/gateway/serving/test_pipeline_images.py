"""Prompts with images through the pipeline over fake workers: prefill gets the encoder's
embeddings (or, without an encoder, the image files), decode gets the prompt as prefill
expanded it and no images; a colocated worker gets them; the kvstore is not consulted (its
keys are token ids alone)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc.aio
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.gateway.common.generation import GenerationSpec
from libs.gateway.serving.migration import Migration
from libs.tokenization import Tokenizer
from tests.libs.gateway.serving.test_pipeline import ANSWER, FakeWorker, Stack, run, spec
from tests.libs.gateway.serving.test_pipeline import stack as stack
from tests.libs.gateway.serving.test_pipeline import tokenizer as tokenizer

pytestmark = pytest.mark.anyio
EXPANSION = 3  # fake engine: each prompt token 7 (the placeholder) becomes 3 tokens


class ImageWorker(FakeWorker):
    def __init__(self, tokens: list[int]) -> None:
        super().__init__(tokens)
        self.prefill_images: list[int] = []
        self.generate_images: list[int] = []
        self.prefill_files: list[int] = []
        self.generate_files: list[int] = []
        self.generate_prompts: list[list[int]] = []

    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        response = await super().Prefill(request, context)
        self.prefill_images.append(len(request.image_embeddings))
        self.prefill_files.append(len(request.images))
        if request.image_embeddings or request.images:
            response.prompt_token_ids.extend(expand(request.prompt_token_ids))
        return response

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self.generate_images.append(len(request.image_embeddings))
        self.generate_files.append(len(request.images))
        self.generate_prompts.append(list(request.prompt_token_ids))
        async for response in super().Generate(request, context):
            yield response


def expand(prompt: Sequence[int]) -> list[int]:
    return [t for token in prompt for t in ([token] * EXPANSION if token == 7 else [token])]


def image_spec(tokenizer: Tokenizer) -> GenerationSpec:
    embedding = common_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT32, shape=[3, 1], data=b"\0" * 12)
    base = spec(tokenizer)
    return replace(
        base, prompt_token_ids=[*base.prompt_token_ids, 7], image_embeddings=(embedding, embedding)
    )


def file_spec(tokenizer: Tokenizer) -> GenerationSpec:
    """No encoder: the image files themselves (the workers' engines encode them)."""
    base = spec(tokenizer)
    return replace(base, prompt_token_ids=[*base.prompt_token_ids, 7], images=(b"png-1", b"png-2"))


class CountingLookup:
    def __init__(self) -> None:
        self.calls = 0

    async def matched_tokens(
        self, request_id: str, token_ids: Sequence[int], cache_salt: str = "", lora: object = None
    ) -> int:
        self.calls += 1
        return len(token_ids)  # "holds everything": would skip prefill for a text prompt


async def test_pd_prefill_gets_embeddings_decode_the_expanded_prompt(
    stack: Stack,
    tokenizer: Tokenizer,
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = ImageWorker(tokens), ImageWorker(tokens)
    lookup = CountingLookup()
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]}, prefix_lookup=lookup)
    request = image_spec(tokenizer)
    text, _events, finished = await run(pipeline, request)
    await pool.close()
    assert text == ANSWER and finished is not None
    assert prefill.prefill_images == [2]
    assert decode.generate_images == [0] and decode.generate_had_handoff == [True]
    assert decode.generate_prompts == [expand(request.prompt_token_ids)]
    assert lookup.calls == 0


async def test_colocated_worker_gets_the_embeddings(
    stack: Stack,
    tokenizer: Tokenizer,
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    worker = ImageWorker(tokens)
    pipeline, pool = await stack.pipeline({"both": [worker]})
    request = image_spec(tokenizer)
    text, _events, _finished = await run(pipeline, request)
    await pool.close()
    assert text == ANSWER
    assert worker.generate_images == [2] and worker.generate_prompts == [request.prompt_token_ids]


def test_image_requests_prefilled_elsewhere_are_not_migrated() -> None:
    handed_off = worker_pb2.GenerateRequest(
        prompt_token_ids=[1, 7, 7, 7], handoff=worker_pb2.KvHandoff(transport="nixl")
    )
    assert Migration(handed_off, limit=2, images=True)._refusal() == (
        "images",
        "requests with images prefilled elsewhere are not migrated",
    )
    # A colocated request carries its embeddings: its continuation can recompute the prompt.
    colocated = worker_pb2.GenerateRequest(prompt_token_ids=[1, 7], image_embeddings=[common_pb2.Tensor()])
    assert Migration(colocated, limit=2, images=True)._refusal() is None
    assert Migration(handed_off, limit=2)._refusal() is None


async def test_without_an_encoder_prefill_gets_the_files_decode_the_expanded_prompt(
    stack: Stack,
    tokenizer: Tokenizer,
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    prefill, decode = ImageWorker(tokens), ImageWorker(tokens)
    lookup = CountingLookup()
    pipeline, pool = await stack.pipeline({"prefill": [prefill], "decode": [decode]}, prefix_lookup=lookup)
    request = file_spec(tokenizer)
    text, _events, _finished = await run(pipeline, request)
    await pool.close()
    assert text == ANSWER
    assert prefill.prefill_files == [2] and prefill.prefill_images == [0]
    assert decode.generate_files == [0] and decode.generate_had_handoff == [True]
    assert decode.generate_prompts == [expand(request.prompt_token_ids)]
    assert lookup.calls == 0


async def test_without_an_encoder_the_colocated_worker_gets_the_files(
    stack: Stack,
    tokenizer: Tokenizer,
) -> None:
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    worker = ImageWorker(tokens)
    pipeline, pool = await stack.pipeline({"both": [worker]})
    request = file_spec(tokenizer)
    text, _events, _finished = await run(pipeline, request)
    await pool.close()
    assert text == ANSWER
    assert worker.generate_files == [2] and worker.generate_images == [0]
    handed_off = worker_pb2.GenerateRequest(
        prompt_token_ids=[1, 7, 7, 7], handoff=worker_pb2.KvHandoff(transport="nixl")
    )
    # As with embeddings: a colocated request with its files can be recomputed elsewhere.
    assert Migration(worker_pb2.GenerateRequest(images=[b"png"]), limit=2, images=True)._refusal() is None
    assert Migration(handed_off, limit=2, images=True)._refusal() is not None
