"""Image files through the worker (fake engine), the path without an encoder service: each
file is decoded with the encoder's checks and limits and the engine gets PIL images (it runs
the vision tower); the prefill answers with the expanded prompt; a text-only model, a bad
image, or images together with embeddings are the client's mistake."""

from __future__ import annotations

import dataclasses
import io
import random

import pytest
import torch
from PIL import Image

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.encoder.tensors import to_proto
from libs.worker.config import WorkerConfig
from libs.worker.errors import InvalidRequest
from libs.worker.service import WorkerService
from tests.libs.worker.fake_engine import INFO, FakeEngine

pytestmark = pytest.mark.anyio


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), random.Random(0).randbytes(width * height * 3)).save(
        out, format="PNG"
    )
    return out.getvalue()


def make(
    role: Role, *, takes_images: bool = True, mm_embeds: bool = False
) -> tuple[WorkerService, FakeEngine]:
    engine = FakeEngine(dataclasses.replace(INFO, takes_images=takes_images))
    config = WorkerConfig(
        role=role, model="/nonexistent", served_model_name="fake", enable_mm_embeds=mm_embeds
    )
    return WorkerService(config, engine, address="127.0.0.1:1"), engine


async def test_prefill_gives_the_engine_pil_images_and_returns_the_expanded_prompt() -> None:
    service, engine = make(Role.PREFILL)
    request = worker_pb2.PrefillRequest(
        metadata=common_pb2.RequestMetadata(request_id="r"), prompt_token_ids=[5, 6], images=[png(3, 2)]
    )
    response = await service.prefill(request)
    (given,) = engine.calls[0]["images"]
    assert isinstance(given, Image.Image) and given.size == (3, 2) and given.mode == "RGB"
    assert engine.calls[0]["image_embeddings"] == []
    assert list(response.prompt_token_ids) == [5, 6, 0, 0, 0, 0]


async def test_colocated_generate_takes_several_images() -> None:
    service, engine = make(Role.BOTH)
    request = worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id="g"),
        prompt_token_ids=[5, 6],
        sampling=common_pb2.SamplingParams(max_tokens=2),
        images=[png(4, 4), png(8, 2)],
    )
    responses = [r async for r in service.generate(request)]
    assert [i.size for i in engine.calls[0]["images"]] == [(4, 4), (8, 2)]
    assert responses[-1].complete.usage.prompt_tokens == 10


async def test_worker_info_says_whether_the_model_takes_images() -> None:
    for takes in (True, False):
        service, _engine = make(Role.BOTH, takes_images=takes)
        assert service.info().takes_images is takes


@pytest.mark.parametrize(
    ("takes_images", "files", "embeddings", "message"),
    [
        (False, [png(2, 2)], [], "text-only"),
        (True, [b"not an image at all"], [], "not an image"),
        (True, [png(64, 64)[:2000]], [], "corrupt or truncated"),
        (True, [png(2, 2)], [to_proto(torch.zeros(3, 2))], "either images or image embeddings"),
    ],
)
async def test_refusals(
    takes_images: bool, files: list[bytes], embeddings: list[common_pb2.Tensor], message: str
) -> None:
    service, engine = make(Role.PREFILL, takes_images=takes_images, mm_embeds=True)
    request = worker_pb2.PrefillRequest(prompt_token_ids=[5], images=files, image_embeddings=embeddings)
    with pytest.raises(InvalidRequest, match=message):
        await service.prefill(request)
    assert engine.calls == []
