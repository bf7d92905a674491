"""Image embeddings through the worker (fake engine): decoded from the contract's tensors and
given to the engine; the prefill answers with the prompt as the engine expanded it; a worker
without --enable-mm-embeds, or a tensor that does not add up, is the client's mistake."""

from __future__ import annotations

import pytest
import torch

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.encoder.tensors import to_proto
from libs.worker.config import WorkerConfig
from libs.worker.errors import InvalidRequest
from libs.worker.service import WorkerService
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio
EMBEDDING = torch.arange(6, dtype=torch.float32).reshape(3, 2)


def make(role: Role, *, mm_embeds: bool = True) -> tuple[WorkerService, FakeEngine]:
    engine = FakeEngine()
    config = WorkerConfig(
        role=role, model="/nonexistent", served_model_name="fake", enable_mm_embeds=mm_embeds
    )
    return WorkerService(config, engine, address="127.0.0.1:1"), engine


async def test_prefill_gives_the_engine_tensors_and_returns_the_expanded_prompt() -> None:
    service, engine = make(Role.PREFILL)
    request = worker_pb2.PrefillRequest(
        metadata=common_pb2.RequestMetadata(request_id="r"),
        prompt_token_ids=[5, 6],
        image_embeddings=[to_proto(EMBEDDING)],
    )
    response = await service.prefill(request)
    (given,) = engine.calls[0]["image_embeddings"]
    assert torch.equal(given, EMBEDDING)
    assert list(response.prompt_token_ids) == [5, 6, 0, 0, 0]
    assert response.usage.prompt_tokens == 5


async def test_colocated_generate_counts_the_expanded_prompt() -> None:
    service, engine = make(Role.BOTH)
    request = worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id="g"),
        prompt_token_ids=[5, 6],
        sampling=common_pb2.SamplingParams(max_tokens=2),
        image_embeddings=[to_proto(EMBEDDING), to_proto(EMBEDDING)],
    )
    responses = [r async for r in service.generate(request)]
    assert len(engine.calls[0]["image_embeddings"]) == 2
    assert responses[-1].complete.usage.prompt_tokens == 8


async def test_text_prompts_pass_no_embeddings() -> None:
    service, engine = make(Role.PREFILL)
    response = await service.prefill(worker_pb2.PrefillRequest(prompt_token_ids=[5, 6]))
    assert engine.calls[0]["image_embeddings"] == [] and not response.prompt_token_ids


@pytest.mark.parametrize(
    ("mm_embeds", "tensor", "message"),
    [
        (False, to_proto(EMBEDDING), "--enable-mm-embeds"),
        (
            True,
            common_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT32, shape=[3, 2], data=b"\0" * 4),
            "need 24 bytes",
        ),
    ],
)
async def test_refusals(mm_embeds: bool, tensor: common_pb2.Tensor, message: str) -> None:
    service, engine = make(Role.PREFILL, mm_embeds=mm_embeds)
    with pytest.raises(InvalidRequest, match=message):
        await service.prefill(worker_pb2.PrefillRequest(prompt_token_ids=[5], image_embeddings=[tensor]))
    assert engine.calls == []
