"""Client mistakes are refused by the worker as InvalidRequest (gRPC INVALID_ARGUMENT) before
the engine sees them; what the engine itself refuses stays the client's mistake too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.rpc.errors import FailedPrecondition
from libs.worker.config import WorkerConfig
from libs.worker.engine import Adapter, EngineStep
from libs.worker.errors import InvalidRequest
from libs.worker.service import WorkerService, WrongRole
from libs.worker.validation import validate_token_fields
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


def make(role: Role, engine: FakeEngine | None = None) -> tuple[WorkerService, FakeEngine]:
    engine = engine or FakeEngine()
    config = WorkerConfig(role=role, model="/nonexistent", served_model_name="fake")
    return WorkerService(config, engine, address="127.0.0.1:1"), engine


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (common_pb2.SamplingParams(logit_bias={1000: 5.0}), r"logit_bias has 1 token id\(s\) outside .*1000\): 1000"),
        (common_pb2.SamplingParams(logit_bias={-3: 1.0, 7: 1.0}), r"logit_bias .*: -3"),
        (common_pb2.SamplingParams(stop_token_ids=[5, 4000]), r"stop_token_ids .*: 4000"),
    ],
)  # fmt: skip
async def test_out_of_vocabulary_token_fields_never_reach_the_engine(
    sampling: common_pb2.SamplingParams, message: str
) -> None:
    prefill, prefill_engine = make(Role.PREFILL)
    with pytest.raises(InvalidRequest, match=message):
        await prefill.prefill(worker_pb2.PrefillRequest(prompt_token_ids=[5, 6], sampling=sampling))
    decode, decode_engine = make(Role.BOTH)
    with pytest.raises(InvalidRequest, match=message):
        async for _ in decode.generate(
            worker_pb2.GenerateRequest(prompt_token_ids=[5, 6], sampling=sampling)
        ):
            pass
    assert prefill_engine.calls == [] and decode_engine.calls == []


def test_token_fields_inside_the_vocabulary_pass() -> None:
    validate_token_fields(
        common_pb2.SamplingParams(logit_bias={0: 1.0, 999: -1.0}, stop_token_ids=[2]), vocab_size=1000
    )


class RefusingEngine(FakeEngine):
    """An engine whose own request checks refuse the request (as vLLM's input processing does
    for what the worker cannot check ahead, e.g. logprobs above the engine's maximum)."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        sequences: Sequence[tuple[int, Sequence[int]]] = (),
        lora: Adapter | None = None,
    ) -> AsyncIterator[EngineStep]:
        async def refuse() -> AsyncIterator[EngineStep]:
            if sampling.get("logprobs", 0) > 20:
                raise InvalidRequest("Requested sample logprobs of 50, which is greater than max allowed: 20")
            yield EngineStep(sequences=(), finished=True)

        return refuse()


async def test_what_the_engine_refuses_stays_an_invalid_request_and_is_aborted() -> None:
    service, engine = make(Role.BOTH, RefusingEngine())
    request = worker_pb2.GenerateRequest(
        metadata=common_pb2.RequestMetadata(request_id="r1"),
        prompt_token_ids=[5],
        sampling=common_pb2.SamplingParams(logprobs=50),
    )
    with pytest.raises(InvalidRequest, match="max allowed: 20"):
        async for _ in service.generate(request):
            pass
    # The request is not left running, and its id can be used again.
    assert engine.aborted == ["r1"]
    with pytest.raises(InvalidRequest):
        async for _ in service.generate(request):
            pass


async def test_a_wrong_role_is_a_failed_precondition_not_the_clients_mistake() -> None:
    service, _ = make(Role.DECODE)
    with pytest.raises(WrongRole) as raised:
        await service.prefill(worker_pb2.PrefillRequest(prompt_token_ids=[1]))
    assert isinstance(raised.value, FailedPrecondition) and not isinstance(raised.value, InvalidRequest)


async def test_a_malformed_release_is_an_invalid_request() -> None:
    service, engine = make(Role.DECODE)
    with pytest.raises(InvalidRequest):
        await service.release_kv(worker_pb2.ReleaseKvRequest(request_id="r", handoff=worker_pb2.KvHandoff()))
    assert engine.released == []


def _moved(*sequences: tuple[int, list[int]], **request: Any) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        prompt_token_ids=[5, 6],
        sampling=common_pb2.SamplingParams(n=3, max_tokens=4, temperature=1.0),
        sequences=[worker_pb2.SequencePrefix(index=i, token_ids=t) for i, t in sequences],
        **request,
    )


async def test_a_moved_requests_sequences_reach_the_engine() -> None:
    worker, engine = make(Role.BOTH)
    async for _ in worker.generate(_moved((0, [7]), (2, [8, 9]))):
        pass
    assert engine.calls[0]["sequences"] == [(0, [7]), (2, [8, 9])]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_moved((0, [7]), (0, [8])), r"distinct indexes in \[0, n=3\)"),
        (_moved((3, [7])), r"distinct indexes in \[0, n=3\)"),
        (_moved((1, [7, 8, 9, 10])), "sequence 1 already has 4 tokens of max_tokens=4"),
        (_moved((1, [7]), images=[b"x"]), "cannot come with a KV handoff or images"),
    ],
)
async def test_a_moved_request_that_cannot_be_continued_is_refused(
    request_: worker_pb2.GenerateRequest, message: str
) -> None:
    worker, engine = make(Role.BOTH)
    with pytest.raises(InvalidRequest, match=message):
        async for _ in worker.generate(request_):
            pass
    assert engine.calls == []
